"""The `benchgen-router` command: one subcommand per job.

    benchgen-router route "What is the derivative of x^3 + 2x?"
    benchgen-router train --rewards rewards.jsonl --tasks tasks.jsonl --output-dir run/ --export router/
    benchgen-router evaluate --model router/ --rewards rewards.jsonl --tasks tasks.jsonl
    benchgen-router convert --manifest manifest.json --weights head_weights.npy --output-dir router/
    benchgen-router bench --layers 4 --queries 16
    benchgen-router serve --model router/ --port 8000
    benchgen-router frontier --rewards rewards.jsonl --tasks tasks.jsonl --calls calls.jsonl
    benchgen-router collect --tasks tasks.jsonl --pool agents.json --repetitions 3 --output calls.jsonl

Arguments are checked before torch or transformers are imported, so bad usage is reported at once.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from benchgen_router.cli.common import EXIT_CODES_HELP, add_verbosity_arguments, configure_output, run_command

# subcommand -> module of benchgen_router.cli with HELP, add_arguments(parser) and run(args)
COMMANDS = {
    "route": "route",
    "train": "train",
    "evaluate": "evaluate",
    "convert": "convert",
    "bench": "bench",
    "serve": "serve",
    "frontier": "frontier",
    "collect": "collect",
    "import": "import_outcomes",
}


def build_parser(prog: str = "benchgen-router") -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(__doc__ or "").split("\n\n")[0],
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    subparsers = {}
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"benchgen_router.cli.{module_name}")
        subparser = commands.add_parser(name, help=module.HELP)
        module.add_arguments(subparser)
        add_verbosity_arguments(subparser)
        subparser.set_defaults(module=module)
        subparsers[name] = subparser
    return parser, subparsers


def main(argv: Sequence[str] | None = None, prog: str = "benchgen-router") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, subparsers = build_parser(prog)
    args = parser.parse_args(argv)
    module = args.module
    configure_output(args.verbose)

    def finish() -> int:
        nonlocal args
        if hasattr(module, "check_arguments"):
            module.check_arguments(subparsers[args.command], args)
        if hasattr(module, "finish_arguments"):
            args = module.finish_arguments(subparsers[args.command], args, lambda: parser.parse_args(argv))
        return module.run(args)

    return run_command(lambda _: finish(), args)


if __name__ == "__main__":
    sys.exit(main())
