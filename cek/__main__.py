"""The `cek` command and `python -m cek`.

`run` imports the command line itself, so that Ctrl-C while its modules are still being
imported is one line and exit 130, as it is once the command runs (cek.cli.Interrupted).
"""

import sys


def run() -> None:
    try:
        from cek.cli import main

        main(prog_name="cek")
    except KeyboardInterrupt:
        print("Error: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    run()
