"""The `llamaspec` command line: parsers and one handler per command; the noxfile calls the
same entry.

Each command's parser sets `handler` (`set_defaults(handler=cmd_...)`), a function of the
parsed arguments and the console that calls the one stage function the command runs and
prints its result; `main` parses, sets up the console and errors, and calls it.

May import anything below it. Stage modules are imported lazily, inside the command that
needs them, so `llamaspec --help` stays fast.
"""


def main(argv=None) -> int:
    """Console-script entry point."""
    from llamaspec.cli.main import main as _main

    return _main(argv)
