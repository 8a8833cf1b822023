"""The `llamaspec` command line: parsers and dispatch only; the noxfile calls the same entry.

May import anything below it. Stage modules are imported lazily, inside the command that
needs them, so `llamaspec --help` stays fast.
"""


def main(argv=None) -> int:
    """Console-script entry point."""
    from llamaspec.cli.main import main as _main

    return _main(argv)
