"""The ``flexigpt`` command: one subcommand per module under ``flexigpt/commands``.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``; it is imported only when its subcommand runs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

#: subcommand → module. Add a command by adding a module and a line here.
COMMANDS: dict[str, str] = {
    "fetch": "flexigpt.commands.fetch",
    "compress": "flexigpt.commands.compress",
    "train": "flexigpt.commands.train",
    "extend": "flexigpt.commands.extend",
    "evaluate": "flexigpt.commands.evaluate",
    "tables": "flexigpt.commands.tables",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="flexigpt", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, module_name in COMMANDS.items():
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP))
        else:
            sub.add_parser(name, help=f"(see flexigpt {name} --help)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    module = importlib.import_module(COMMANDS[args.command])
    try:
        return int(module.run(args) or 0)
    except (ValueError, RuntimeError, KeyError, FileNotFoundError) as err:
        logging.getLogger("flexigpt").error("%s: %s", type(err).__name__, err)
        if args.verbose:
            raise
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
