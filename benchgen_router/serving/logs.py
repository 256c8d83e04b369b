"""Ray Serve's warnings that repeat under load, one line a minute instead of one per request.

When the machine's cores are all busy, a router replica answers its callers' queue-length probes
(Ray Serve's proxy, in standard mode) late, and hands back requests beyond its limit, and Ray
Serve logs a warning for each: hundreds a minute, which bury every other line.
The first of each is logged as it comes; later ones are counted and logged once a period with
their count, so a real and lasting problem still shows, at a rate someone can read.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

# What Ray Serve logs when a replica is slow to answer a caller's probe, and when a replica
# hands a request back because it holds its max_ongoing_requests already (the request is then
# sent to another replica, or again): both are routine on a saturated machine.
REPEATING_UNDER_LOAD = ("Failed to get queue length from", "Replica at capacity of max_ongoing_requests")
PERIOD_S = 60.0


@dataclass
class Seen:
    logged_at: float
    held_back: int = 0


class RepeatedWarnings(logging.Filter):
    """Passes the first record of each message in `patterns`, then one per `period_s` that says
    how many were held back since the last; every other record passes untouched."""

    def __init__(self, patterns: tuple[str, ...] = REPEATING_UNDER_LOAD, period_s: float = PERIOD_S) -> None:
        super().__init__()
        self.patterns = patterns
        self.period_s = period_s
        self.seen: dict[str, Seen] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        pattern = next((pattern for pattern in self.patterns if pattern in text), None)
        if pattern is None:
            return True
        now = time.monotonic()
        seen = self.seen.get(pattern)
        if seen is None or now - seen.logged_at >= self.period_s:
            if seen is not None and seen.held_back:
                record.msg = f"{text} ({seen.held_back} more like it in the last {now - seen.logged_at:.0f} s)"
                record.args = ()
            self.seen[pattern] = Seen(now)
            return True
        seen.held_back += 1
        return False


def quiet_repeated_warnings(logger_name: str = "ray.serve") -> None:
    """Install the filter on Ray Serve's logger in this process, once."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(existing, RepeatedWarnings) for existing in logger.filters):
        logger.addFilter(RepeatedWarnings())
