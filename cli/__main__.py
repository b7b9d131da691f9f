from semjobs.cli.main import run

run()
