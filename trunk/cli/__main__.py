from trunk.cli import main

main()
