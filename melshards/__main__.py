from melshards.cli import main

main()
