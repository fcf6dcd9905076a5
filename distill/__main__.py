from distill.cli.app import main

main()
