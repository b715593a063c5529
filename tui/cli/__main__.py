"""`python -m tui.cli`: the same as `specchat`."""

import sys

from tui.cli.entry import main

if __name__ == "__main__":
    sys.exit(main())
