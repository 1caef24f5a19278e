from shipyard.cli.app import main

main()
