from melshards.commands import main

main()
