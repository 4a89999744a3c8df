import sys

from ornith_stack.cli import main

sys.exit(main())
