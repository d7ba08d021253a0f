from preprocess.run import main

main()
