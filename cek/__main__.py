from cek.cli import main

main(prog_name="cek")
