"""serving/service.py without a Ray: how a failure to start is told in one line."""

from __future__ import annotations

import pytest

ray_exceptions = pytest.importorskip("ray.exceptions")

from benchgen_router.serving.service import ray_failure  # noqa: E402


def test_a_task_error_is_told_by_its_innermost_cause():
    inner = OSError(98, "Address already in use")
    traceback_text = 'Traceback (most recent call last):\n  File "proxy.py", line 9, in start\nOSError: in use'
    wrapped = ray_exceptions.RayTaskError("ServeController.deploy_applications", traceback_text, inner, pid=42)
    outer = ray_exceptions.RayTaskError("serve.run", "Traceback (most recent call last):", wrapped, pid=43)
    assert ray_failure(outer) == "[Errno 98] Address already in use"


def test_a_plain_error_is_its_first_told_line():
    told = RuntimeError("ray::ServeController (pid=7)\n\nHAProxy failed to bind 127.0.0.1:8000\n  File x.py")
    assert ray_failure(told) == "HAProxy failed to bind 127.0.0.1:8000"
    assert ray_failure(RuntimeError("")) == "RuntimeError"
    assert len(ray_failure(RuntimeError("x" * 1000))) == 300


def test_haproxy_is_told_by_its_first_alert_not_its_notices():
    told = RuntimeError(
        "HAProxy crashed during startup: [NOTICE]   (2095) : haproxy version is 2.8.25\n"
        "[NOTICE]   (2095) : path to executable is /bin/haproxy\n"
        "[ALERT]    (2095) : Binding [haproxy.cfg:45] for frontend prometheus: cannot bind socket (Address "
        "already in use) for [0.0.0.0:23850]\n"
        "[ALERT]    (2095) : [/bin/haproxy.main()] Some protocols failed to start their listeners! Exiting."
    )
    assert ray_failure(told) == (
        "HAProxy: Binding [haproxy.cfg:45] for frontend prometheus: cannot bind socket (Address already in use) "
        "for [0.0.0.0:23850]"
    )
