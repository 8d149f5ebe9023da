from souk.cli.main import entry

entry()
