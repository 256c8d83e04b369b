"""Import paths: names a package loads only when used (`lazy_names`), and paths that moved, which keep
working until the next minor version, with a warning (`moved_to`).

A module left at an old path is two lines:

    from benchgen_router.moved import moved_to
    __getattr__ = moved_to(__name__, "benchgen_router.training.run")

Importing it warns once (DeprecationWarning, pointing at the importer's line), and every name read
from it is the new module's own object, private names included.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

REMOVED_IN = "0.4.0"


def moved_to(old: str, new: str) -> Callable[[str], Any]:
    """Warn that `old` moved to `new`; return the module-level __getattr__ (PEP 562) that reads from `new`."""
    # stacklevel 3: past this function and the old module's body to the importer (importlib's frames are skipped)
    warnings.warn(f"{old} moved to {new}; import from there ({old} goes in {REMOVED_IN})", DeprecationWarning, 3)

    def __getattr__(name: str) -> Any:
        return getattr(importlib.import_module(new), name)

    return __getattr__


def lazy_names(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's __getattr__ and __dir__ (PEP 562) that import `names[name]` (a module path) only when
    `name` is first read, so importing the package imports none of them."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(names))

    return __getattr__, __dir__
