from semjobs.cli.main import main

main(prog_name="semjobs")
