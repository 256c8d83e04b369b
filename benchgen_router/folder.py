"""Moved to benchgen_router.release.folder; this path warns and goes in the next minor version."""

from benchgen_router.moved import moved_to

__getattr__ = moved_to(__name__, "benchgen_router.release.folder")
