from cacheserver.cli import main

main(prog_name="cacheserver")
