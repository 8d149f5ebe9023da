from souk.cli.main import app

app()
