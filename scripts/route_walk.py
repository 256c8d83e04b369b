"""The walk of one routed file through the package's modules: which modules it enters, and how
often a call climbs back up into a module already on the call stack.

    python scripts/route_walk.py            # routes 8 pilot-style questions with the default router

A call from module B into module A while A is lower on the stack (A called B, or called what called
B) is a climb back up: the lower layer depends on the one above it. Every call from one module into
another is listed too, so that a walk that goes down into the model twice for one batch shows.
Only the package's own modules and the two remote-code files count; calls through torch or
transformers are seen through.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType

QUERIES = [
    "What is the derivative of x^3 + 2x?",
    "Which planet is closest to the sun?",
    "Problem: Solve 2x + 3 = 11.\n\nGive the final answer as `Answer: <number>`.",
    "Name the author of Pride and Prejudice.",
    "Bonjour, comment vas-tu ?",
    "Write a haiku about autumn.",
    "How many primes are below 30?",
    "What is the capital of Australia?",
]


def module_of(path: str, roots: tuple[str, ...]) -> str | None:
    for root in roots:
        if path.startswith(root):
            relative = Path(path).relative_to(Path(root).parent)
            return ".".join(relative.with_suffix("").parts)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.parse_args()
    import benchgen_router
    from benchgen_router.cli.main import main as cli

    package = str(Path(benchgen_router.__file__).parent)
    root = str(Path(package).parent)
    roots = (package + "/", root + "/modeling_router.py", root + "/configuration_router.py")
    stack: list[str] = []
    entered: Counter[str] = Counter()
    climbs: Counter[tuple[str, str]] = Counter()
    crossings: Counter[tuple[str, str]] = Counter()  # calls from one module into another

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event not in ("call", "return"):
            return
        module = module_of(frame.f_code.co_filename, roots)
        if module is None:
            return
        if event == "return":
            if stack:
                stack.pop()
            return
        caller = stack[-1] if stack else None
        if caller is not None and module != caller and module in stack:
            climbs[(caller, module)] += 1
        if caller is not None and module != caller:
            crossings[(caller, module)] += 1
        entered[module] += 1
        stack.append(module)

    with tempfile.TemporaryDirectory() as folder:
        queries = Path(folder) / "queries.txt"
        queries.write_text("\n".join(q.replace("\n", " ") for q in QUERIES) + "\n", encoding="utf-8")
        output = Path(folder) / "routed.jsonl"
        cli(["route", "--input", str(queries), "--output", str(output)])  # warm: imports and the model load
        stack.clear()
        sys.setprofile(profile)
        try:
            cli(["route", "--input", str(queries), "--output", str(output)])
        finally:
            sys.setprofile(None)
    print(f"modules entered: {len(entered)}")
    for module, count in sorted(entered.items()):
        print(f"  {module}: {count} calls")
    print(f"calls between modules: {len(crossings)} distinct, {sum(crossings.values())} calls")
    for (caller, callee), count in sorted(crossings.items()):
        print(f"  {caller} -> {callee}: {count}")
    print(f"climbs back up: {len(climbs)} distinct (caller -> callee), {sum(climbs.values())} calls")
    for (caller, callee), count in sorted(climbs.items()):
        print(f"  {caller} -> {callee}: {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
