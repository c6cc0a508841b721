from offlab.cli import main

main()
