"""The `specchat` command line: one module per subcommand (see `tui.cli.entry`); `main` is the console script."""

from tui.cli.entry import main

__all__ = ["main"]
