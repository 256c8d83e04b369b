"""The service under load and abuse, on loopback, as the command line runs it (`benchgen-router
serve` in a child process with its own Ray): start-up probes get JSON, stalled uploads and
chunked bodies over the limit cost normal traffic nothing, a client gone mid-body is one log
line, HAProxy answers on loopback in throughput mode (the default) and Ray Serve's proxy in
standard mode, the metrics port listens on loopback only, SIGTERM under load answers every
request in flight and exits 143, and Ctrl-C exits 130. Every loop stops by itself, in count
and in time.

The abuse mix prints the figures that docs/service.md records: the share of normal requests
answered, their p99 and the replicas' memory before and after."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest

from benchgen_router.serving import free_port
from helpers import AGENTS, PROJECT_ROOT, listeners, make_queries
from http_client import raw_exchange, request

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.slow

MAX_BYTES = 4096
BODY_TIMEOUT_S = 10  # the service's (serving.app.BODY_TIMEOUT_S)
QUERIES = make_queries(32, seed=11)


def start_cli_service(log_path: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    with log_path.open("wb") as log_file:
        child = subprocess.Popen(
            [sys.executable, "-m", "benchgen_router.cli.main", "serve", "--port", str(port), *extra],
            cwd=PROJECT_ROOT,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
            # A shell's background job ignores SIGINT, and its children inherit that: the
            # command's own Ctrl-C handling is what is tested.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    return child, f"http://127.0.0.1:{port}"


def probe_until_ready(child: subprocess.Popen, url: str, log_path: Path) -> list[tuple[int | str, bool, str]]:
    """(status or "refused", is JSON, body) of /healthz every 50 ms until it answers 200."""
    probes: list[tuple[int | str, bool, str]] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and child.poll() is None:
        try:
            status, body = request(url + "/healthz", timeout=30)
        except OSError:
            probes.append(("refused", False, ""))
            time.sleep(0.05)
            continue
        probes.append((status, "not_json" not in body, json.dumps(body)[:200]))
        if status == 200:
            return probes
        time.sleep(0.05)
    raise AssertionError(f"the service did not come up: {log_path.read_text()[-3000:]}")


def wait_for_log(log_path: Path, text: str, timeout_s: float = 30) -> str:
    """The log once it holds `text`: /healthz can answer before the command has logged that it
    is serving."""
    deadline = time.monotonic() + timeout_s
    while text not in (log := log_path.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert text in log, log[-3000:]
    return log


def is_loopback(ip: str) -> bool:
    """127.0.0.1, ::1, or 127.0.0.1 as an IPv6 socket sees it (::ffff:127.0.0.1)."""
    address = ipaddress.ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def processes_of(child: subprocess.Popen, title: str) -> list[psutil.Process]:
    found = []
    for process in psutil.Process(child.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if title in " ".join(process.cmdline()):
                found.append(process)
    return found


def rss_mb(processes: list[psutil.Process]) -> float:
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total / 2**20


def route(url: str, queries: list[str], timeout: float = 60) -> tuple[int, dict]:
    return request(url + "/v1/route", json.dumps({"queries": queries}).encode(), timeout=timeout)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("served") / "serve.log"
    child, url = start_cli_service(log_path, "--max-request-bytes", str(MAX_BYTES))
    try:
        probes = probe_until_ready(child, url, log_path)
        yield child, url, probes, log_path
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_start_up_probes_get_a_json_503_until_the_router_is_loaded(served):
    """Probes from the first moment: Ray's front answers a plain 404 until the application is
    deployed, then every answer is the replica's JSON, a 503 saying it is loading until a 200. (The
    replica loads the router in the background while Ray Serve publishes its route, so the 503s
    may be few or none here; test_serving_app pins them.)"""
    _, _, probes, _ = served
    answers = [probe for probe in probes if probe[0] != "refused"]
    first_json = next(i for i, (_, is_json, _) in enumerate(answers) if is_json)
    assert all(status == 404 for status, _, _ in answers[:first_json]), answers[:first_json]
    assert all(is_json for _, is_json, _ in answers[first_json:]), answers[first_json:]
    statuses = [status for status, _, _ in answers[first_json:]]
    assert set(statuses) <= {503, 200} and statuses[-1] == 200
    assert all('"status": "loading"' in body for status, _, body in answers[first_json:] if status == 503), answers


def test_stalled_uploads_cost_normal_traffic_nothing(served):
    """64 clients send headers and one byte, then stall (as many as a replica once had slots):
    normal requests alongside are all answered, well within the stall timeout, and each stalled
    client gets its 408 in the end."""
    child, url, _, _ = served
    replicas = processes_of(child, "ServeReplica:benchgen-router:Router")
    assert replicas
    before = rss_mb(replicas)
    head = b"POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{"
    latencies: list[float] = []
    statuses: list[int] = []
    lock = threading.Lock()

    def normal(worker: int) -> None:
        stop_at = time.monotonic() + 8
        for index in range(50):  # bounded in count and time
            if time.monotonic() > stop_at:
                return
            started = time.perf_counter()
            status, body = route(url, [QUERIES[(worker * 5 + index) % len(QUERIES)]], timeout=60)
            ok = status == 200 and body["results"][0]["picked_agent"] in AGENTS
            with lock:
                latencies.append(time.perf_counter() - started)
                statuses.append(200 if ok else status)

    with ThreadPoolExecutor(64 + 4) as pool:
        stalled = [pool.submit(raw_exchange, url, head, [], 0.0, 60) for _ in range(64)]
        time.sleep(1.0)  # every stalled client is connected and holds its request open
        workers = [pool.submit(normal, worker) for worker in range(4)]
        for worker in workers:
            worker.result(timeout=120)
        stalled_answers = [future.result(timeout=120) for future in stalled]
    after = rss_mb(replicas)
    answered = statuses.count(200) / max(1, len(statuses))
    p99 = float(np.percentile(latencies, 99)) if latencies else float("inf")
    print(
        f"abuse mix: 64 stalled uploads + 4 clients: {len(statuses)} normal requests, {100 * answered:.1f}% "
        f"answered, p50 {1000 * np.median(latencies):.0f} ms, p99 {1000 * p99:.0f} ms; RSS router replica "
        f"{before:.0f} -> {after:.0f} MB"
    )
    assert len(statuses) >= 20 and answered == 1.0, statuses
    assert p99 < BODY_TIMEOUT_S / 2  # nobody waited for a stalled client's slot
    assert all(answer.startswith(b"HTTP/1.1 408") for answer in stalled_answers), stalled_answers[0][:200]


def test_chunked_bodies_over_the_limit_never_sit_in_memory(served):
    child, url, _, _ = served
    replicas = processes_of(child, "ServeReplica:benchgen-router:Router")
    head = b"POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    piece = b"x" * 65536
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    raw_exchange(url, head, [chunk] * 16)  # the first refusals' one-off costs are not what is measured
    before = rss_mb(replicas)
    with ThreadPoolExecutor(4) as pool:  # 4 x 64 MiB offered against a 4 kB limit
        answers = list(pool.map(lambda _: raw_exchange(url, head, [chunk] * 1024), range(4)))
    assert all(answer.startswith(b"HTTP/1.1 413") for answer in answers), answers[0][:200]
    grown = rss_mb(replicas) - before
    print(f"chunked uploads: 4 x 64 MiB offered, replica RSS grew {grown:.0f} MB")
    assert grown < 64  # less than one of the bodies, a quarter of what was offered
    assert route(url, QUERIES[:2])[0] == 200


def test_a_client_gone_mid_body_is_one_log_line(served):
    _, url, _, log_path = served
    head = b"POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(head + b'{"queries": ["half')
        time.sleep(0.5)
    log = wait_for_log(log_path, "disconnected after")  # Ray forwards the replicas' lines within seconds
    assert log.count("disconnected after") == 1
    assert "Traceback" not in log and "ClientDisconnect" not in log
    assert route(url, QUERIES[:1])[0] == 200


def test_the_metrics_port_listens_on_loopback_only(served):
    _, _, _, log_path = served
    marker = "metrics at http://127.0.0.1:"
    port = int(wait_for_log(log_path, marker).split(marker, 1)[1].split("/", 1)[0])
    listening = [c for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening), listening


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Ray Serve's HAProxy ingress ships for Linux only")
def test_by_default_haproxy_answers_on_loopback_in_front_of_the_replica(served):
    child, url, _, log_path = served
    wait_for_log(log_path, "Ray Serve in throughput mode (HAProxy)")
    assert listeners(int(url.rsplit(":", 1)[1])) == [("haproxy", "127.0.0.1")]
    # The replica's own HTTP server, which HAProxy forwards to, is on loopback too.
    (replica,) = processes_of(child, "ServeReplica:benchgen-router:Router")
    http_servers = [c for c in replica.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.ip != "::"]
    assert http_servers and all(is_loopback(c.laddr.ip) for c in http_servers), http_servers


def test_sigterm_under_load_answers_every_request_in_flight(served):
    """Last: SIGTERM while 24 requests are being routed. Each gets its answer, the command exits
    143 with every Ray process it started gone, and its log has no traceback."""
    child, url, _, log_path = served
    started = psutil.Process(child.pid).children(recursive=True)
    with ThreadPoolExecutor(24) as pool:
        futures = [pool.submit(route, url, QUERIES[i : i + 8], 120) for i in range(24)]
        time.sleep(0.5)  # every request has reached the service
        child.send_signal(signal.SIGTERM)
        outcomes = [future.result(timeout=180) for future in futures]
    assert [status for status, _ in outcomes] == [200] * 24, outcomes[:2]
    assert all(len(body["results"]) == len(QUERIES[i : i + 8]) for i, (_, body) in enumerate(outcomes))
    assert child.wait(timeout=90) == 143
    log = log_path.read_text()
    assert "stopping (SIGTERM)" in log and log.rstrip().endswith("terminated")
    assert "Traceback" not in log
    _, alive = psutil.wait_procs(started, timeout=30)
    assert alive == [], [p.pid for p in alive]


def test_standard_mode_serves_behind_ray_serves_proxy_and_ctrl_c_exits_130(tmp_path):
    log_path = tmp_path / "serve.log"
    child, url = start_cli_service(log_path, "--no-throughput-mode")
    try:
        probe_until_ready(child, url, log_path)
        wait_for_log(log_path, "Ray Serve in standard mode")
        assert [name for name, _ in listeners(int(url.rsplit(":", 1)[1]))] == ["ray::ProxyActor"]
        status, body = route(url, QUERIES[:2])
        assert status == 200 and len(body["results"]) == 2
        assert request(url + "/v1/route", b"[1]")[0] == 400
        started = psutil.Process(child.pid).children(recursive=True)
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=90) == 130
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    log = log_path.read_text()
    assert "stopping (interrupted)" in log and log.rstrip().endswith("interrupted")
    assert "Traceback" not in log
    _, alive = psutil.wait_procs(started, timeout=30)
    assert alive == [], [p.pid for p in alive]
