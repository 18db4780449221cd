from embedcli.cli import main

main()
