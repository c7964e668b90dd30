from cacheserver.cli.main import main

main(prog_name="cacheserver")
