"""`python -m ornith_stack.exporter ...` is `ornith-stack exporter ...`."""

import sys

from ornith_stack.cli import main

if __name__ == "__main__":
    sys.exit(main(["exporter", *sys.argv[1:]]))
