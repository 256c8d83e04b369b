"""What every subcommand shares: argument types, the batching flags, quiet logging and exit codes.

Exit codes: 0 done; 1 some input lines were skipped, the rest done; 2 bad usage or input (one
`error:` line, nothing written); 70 an unexpected error (one line; --verbose shows the traceback);
130 interrupted; 141 stdout closed early (`| head`); 143 stopped by SIGTERM.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchgen_router.errors import Terminated, raise_terminated

EXIT_OK, EXIT_SKIPPED, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 70, 130, 141
EXIT_TERMINATED = 143
EXIT_CODES_HELP = (
    "Exit codes: 0 done; 1 some lines skipped, the rest done; 2 bad usage or input (nothing written); "
    "70 unexpected error; 130 interrupted; 141 stdout closed early; 143 stopped by SIGTERM"
)


def integer_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= minimum (and <= maximum), or a usage error that says so."""
    wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if maximum is not None:
        wanted = f"an integer from {minimum} to {maximum}"

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {value!r}") from None
        if number < minimum or (maximum is not None and number > maximum):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {value}")
        return number

    return parse


def argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a library parser: its InputError becomes argparse's one-line usage error."""
    from benchgen_router.errors import InputError

    def convert(value: str) -> Any:
        try:
            return parse(value)
        except InputError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return convert


positive_int = integer_at_least(1)
non_negative_int = integer_at_least(0)


def add_batching_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--batch-size and --max-batch-tokens, as every tool that runs the backbone takes them."""
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        metavar="N",
        help="queries per forward pass at most (default: as many as --max-batch-tokens holds for a decoder "
        "backbone such as Qwen, whose queries are packed with no padding; 16 for other backbones, whose "
        "length-sorted queries are cut where padding would cost more than another pass)",
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=positive_int,
        metavar="N",
        help="positions per forward pass, for every backbone (default: 2048 on CPU in float32, 4096 on CPU in "
        "bfloat16/float16, 32768 on a GPU); lower it to bound memory",
    )


def add_dtype_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, default: str = "auto") -> None:
    parser.add_argument(
        "--dtype",
        default=default,
        choices=["auto", "float32", "bfloat16", "float16"],
        help="backbone dtype (default: %(default)s: the router's own, float32 for converted releases, the "
        "reference's picks); bfloat16 is the fast path on GPUs and on CPUs with AMX or avx512_bf16",
    )
    parser.add_argument(
        "--allow-emulated-bf16",
        action="store_true",
        help="run bfloat16 even on a CPU without AMX/avx512_bf16, where it is emulated and very slow",
    )


def add_verbosity_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", "-v", action="store_true", help="library notices, load bars and tracebacks")


def configure_output(verbose: bool) -> None:
    """Quiet by default: the project's own messages on stderr, transformers' load bars and notices
    hidden (set before transformers is imported, which reads them once)."""
    if not verbose:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if "transformers" in sys.modules:  # imported while parsing (an argument's type): too late for the variable
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("benchgen_router").setLevel(logging.DEBUG if verbose else logging.INFO)


FULL_OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def run_command(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a subcommand: bad input is one `error: ...` line and exit 2, anything unexpected one line
    and exit 70 (the traceback with --verbose), never exit 1, which means "some lines skipped"."""

    verbose = getattr(args, "verbose", False)
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, raise_terminated) if on_main_thread else None
    try:
        return _run(command, args, verbose)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run(command: Callable[[argparse.Namespace], int], args: argparse.Namespace, verbose: bool) -> int:
    from benchgen_router.errors import RouterError, first_line

    try:
        return command(args)
    except RouterError as err:
        print(f"error: {err.for_command_line()}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print("terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    except Exception as err:
        if isinstance(err, OSError) and err.errno in FULL_OUTPUT_ERRNOS:  # e.g. --output /dev/full
            where = err.filename or "the output"
            print(f"error: cannot write {where} ({err.strerror}); free space or pass another output.", file=sys.stderr)
            return EXIT_USAGE
        if verbose:
            traceback.print_exc()
        print(
            f"error: unexpected {type(err).__name__}: {first_line(err)}"
            + ("" if verbose else " (rerun with --verbose for the traceback)"),
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def read_card_note(note: str | None) -> str | None:
    """--card-note text, or the contents of the file named after '@'."""
    from benchgen_router.errors import InputError

    if note is None or not note.startswith("@"):
        return note
    try:
        return Path(note[1:]).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(
            f"cannot read --card-note file {note[1:]} ({getattr(err, 'strerror', None) or err})."
        ) from None
