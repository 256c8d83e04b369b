"""serving/logs.py: a warning Ray Serve repeats under load is logged once a period, with its count."""

from __future__ import annotations

import logging

from benchgen_router.serving import logs
from benchgen_router.serving.logs import RepeatedWarnings, quiet_repeated_warnings

PROBE = "Failed to get queue length from Replica(id='%s') within 0.1s."


def test_a_flood_is_one_line_a_period_with_the_count_and_other_lines_pass(monkeypatch, caplog):
    clock = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    logger = logging.getLogger("test.serving.logs")
    logger.addFilter(RepeatedWarnings(period_s=60))
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for _ in range(130):  # 5 a second for 130 s
            for replica in "abcde":
                logger.warning(PROBE, replica)
            clock[0] += 1
        logger.error("a replica died")
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0] == PROBE % "a"
    assert messages[1] == PROBE % "a" + " (299 more like it in the last 60 s)"
    assert messages[2] == PROBE % "a" + " (299 more like it in the last 60 s)"
    assert messages[3:] == ["a replica died"]  # nothing else is held back


def test_installing_twice_adds_one_filter():
    name = "test.serving.logs.install"
    quiet_repeated_warnings(name)
    quiet_repeated_warnings(name)
    assert sum(isinstance(f, RepeatedWarnings) for f in logging.getLogger(name).filters) == 1
