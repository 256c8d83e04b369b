"""`benchgen-router serve` stopped the ways users stop it, each as a user's tools send the signal:
the command runs in its own session (as under a terminal, systemd or a container runtime), and
the signal goes to its process group (Ctrl-C, systemd's KillMode=control-group) or to the command
alone (`docker stop`, Kubernetes, `kill PID`). In each: the exit code, requests in flight answered,
an idle stop within seconds, and afterwards no process the service started (HAProxy, raylet, GCS,
workers), its port free at once, and its folder gone. SIGKILL of the command leaves no time to
stop anything: the next `serve` on the same port must start all the same."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from benchgen_router.serving import free_port
from benchgen_router.serving.local_ray import FOLDER_PREFIX
from helpers import PROJECT_ROOT, listeners, make_queries
from http_client import request

pytest.importorskip("ray.serve")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX sessions")]

QUERIES = make_queries(16, seed=5)
IDLE_STOP_S = 5.0  # with nothing in flight, the command returns within this


class Served:
    """A `serve` command in its own session, the processes it started, and its folder."""

    def __init__(self, log_path: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        folders_before = set(Path(tempfile.gettempdir()).glob(FOLDER_PREFIX + "*"))
        with log_path.open("wb") as log_file:
            self.child = subprocess.Popen(
                [sys.executable, "-m", "benchgen_router.cli.main", "serve", "--port", str(self.port)],
                cwd=PROJECT_ROOT,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
                start_new_session=True,
            )
        self.wait_until_ready()
        self.processes = psutil.Process(self.child.pid).children(recursive=True)
        self.folders = set(Path(tempfile.gettempdir()).glob(FOLDER_PREFIX + "*")) - folders_before

    def wait_until_ready(self) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and self.child.poll() is None:
            with contextlib.suppress(OSError):
                if request(self.url + "/healthz", timeout=30)[0] == 200:
                    return
            time.sleep(0.1)
        raise AssertionError(
            f"the service did not come up (listening on its port: {listeners(self.port)}): "
            f"{self.log_path.read_text()[-3000:]}"
        )

    def stopped_cleanly(self) -> None:
        """Nothing it started is left, its port is free, its folder is gone."""
        _, alive = psutil.wait_procs(self.processes, timeout=1)
        assert alive == [], [(p.pid, p.name()) for p in alive]
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", self.port))  # raises when something still holds it
        assert self.folders and not any(folder.exists() for folder in self.folders), self.folders
        assert "Traceback" not in self.log_path.read_text()

    def kill(self) -> None:
        """Whatever is left after a failed test, killed: the command's group, and each process it had started
        (so that no service outlives the test to hold a port the next one asks for)."""
        if self.child.poll() is None:
            os.killpg(self.child.pid, signal.SIGKILL)
            self.child.wait()
        for process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def route(url: str, queries: list[str]) -> tuple[int, dict]:
    return request(url + "/v1/route", json.dumps({"queries": queries}).encode(), timeout=120)


@pytest.mark.parametrize(
    ("how", "code"),
    [("SIGINT to the process group", 130), ("SIGTERM to the command", 143)],
    ids=["ctrl-c", "kill-pid"],
)
def test_a_stop_answers_the_requests_in_flight_then_leaves_nothing(tmp_path, how, code):
    served = Served(tmp_path / "serve.log")
    try:
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(route, served.url, QUERIES[i : i + 8]) for i in range(8)]
            time.sleep(0.3)  # the requests have reached the service
            if how.endswith("process group"):
                os.killpg(served.child.pid, signal.SIGINT)
            else:
                served.child.send_signal(signal.SIGTERM)
            outcomes = [future.result(timeout=120) for future in futures]
        assert served.child.wait(timeout=60) == code
        assert [status for status, _ in outcomes] == [200] * 8, outcomes[:2]
        served.stopped_cleanly()
    finally:
        served.kill()


def test_sigkill_then_the_next_serve_on_the_port_starts_and_an_idle_group_sigterm_is_quick(tmp_path):
    """SIGKILL of the command: Ray's processes and HAProxy die with it, and the port is free for the next
    `serve`; that one, idle, stops on SIGTERM to its process group (systemd) within seconds."""
    first = Served(tmp_path / "first.log")
    try:
        first.child.send_signal(signal.SIGKILL)
        first.child.wait()
        _, alive = psutil.wait_procs(first.processes, timeout=5)
        assert alive == [], [(p.pid, p.name()) for p in alive]
    finally:
        first.kill()
    second = Served(tmp_path / "second.log", port=first.port)
    try:
        assert route(second.url, QUERIES[:2])[0] == 200
        time.sleep(1)  # idle
        started = time.monotonic()
        os.killpg(second.child.pid, signal.SIGTERM)
        assert second.child.wait(timeout=60) == 143
        assert time.monotonic() - started < IDLE_STOP_S, time.monotonic() - started
        second.stopped_cleanly()
        # A killed command cannot remove its own folder: the next service did, its owner being gone.
        assert first.folders and not any(folder.exists() for folder in first.folders)
    finally:
        second.kill()
