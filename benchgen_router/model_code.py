"""Where the router's model code and the committed default router live.

The repository root is the Hub model folder: `configuration_router.py` and `modeling_router.py` (the
remote code) next to the default router's config, weights and tokenizer. A clone or an editable
install has the root on sys.path; a wheel carries the same files in `benchgen_router/default_router/`.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_PACKAGED = PACKAGE_DIR / "default_router"

try:  # a clone or an editable install
    from configuration_router import (
        AUTO_MAP,
        DEFAULT_TRADEOFF,
        DEFAULT_TRUNCATION_LENGTH,
        TRADEOFF_FORMS,
        RouterConfig,
        canonical_query,
        parse_tradeoff,
        resolve_tradeoff,
    )
    from modeling_router import RouterModel, TradeoffCalibration, decide
except ImportError:  # a wheel install
    from benchgen_router.default_router.configuration_router import (
        AUTO_MAP,
        DEFAULT_TRADEOFF,
        DEFAULT_TRUNCATION_LENGTH,
        TRADEOFF_FORMS,
        RouterConfig,
        canonical_query,
        parse_tradeoff,
        resolve_tradeoff,
    )
    from benchgen_router.default_router.modeling_router import RouterModel, TradeoffCalibration, decide

__all__ = [
    "AUTO_MAP",
    "DEFAULT_TRADEOFF",
    "DEFAULT_TRUNCATION_LENGTH",
    "TRADEOFF_FORMS",
    "RouterConfig",
    "RouterModel",
    "TradeoffCalibration",
    "canonical_query",
    "decide",
    "default_router_dir",
    "parse_tradeoff",
    "resolve_tradeoff",
]


def default_router_dir() -> Path:
    """The committed default router: the repository root, or its copy inside a wheel install."""
    return _PACKAGED if (_PACKAGED / "config.json").is_file() else PACKAGE_DIR.parent
