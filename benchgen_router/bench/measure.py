"""Clocks, memory and profiles read inside a benchmark's worker process."""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any


def proc_status_kib(key: str) -> int:
    """VmRSS / VmHWM in KiB: unlike ru_maxrss it can be reset between phases; 0 without /proc."""
    with contextlib.suppress(OSError, StopIteration), open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith(key + ":")).split()[1])
    return 0


def reset_peak_rss() -> bool:
    """Restart VmHWM from the current RSS (Linux >= 4.0), so loading and routing get separate peaks."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def timed(device: str, into: dict[str, float]) -> Iterator[None]:
    """Wall and CPU seconds of the block; a GPU is synchronised first, or queued work would go uncounted."""
    import torch

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    sync()
    wall, cpu = time.perf_counter(), cpu_seconds()
    yield
    sync()
    into["seconds"] = time.perf_counter() - wall
    into["cpu_seconds"] = cpu_seconds() - cpu


def matmul_peaks(device: str, repeats: int, shape: Sequence[int], dtypes: Sequence[str]) -> dict[str, float]:
    """Best GFLOP/s of (tokens x hidden) @ (hidden x intermediate) products per dtype; inputs rotate
    over several sets, so no timing sees a warm cache."""
    import torch

    m, k, n = shape
    peaks = {}
    for name in dtypes:
        dtype = getattr(torch, name)
        generator = torch.Generator(device=device).manual_seed(0)
        pairs = [
            (
                torch.randn(m, k, device=device, dtype=dtype, generator=generator),
                torch.randn(k, n, device=device, dtype=dtype, generator=generator),
            )
            for _ in range(3)
        ]
        for a, b in pairs:
            a @ b
        best = float("inf")
        for i in range(repeats):
            a, b = pairs[i % len(pairs)]
            clock: dict[str, float] = {}
            with timed(device, clock):
                a @ b
            best = min(best, clock["seconds"])
        peaks[name] = 2 * m * k * n / best / 1e9
    return peaks


def load_time_and_rss(start: float, result: dict[str, Any]) -> None:
    """Record loading's wall time and peak RSS, then restart the peak for the routing phase."""
    result["load_seconds"] = time.perf_counter() - start
    result["load_peak_rss"] = proc_status_kib("VmHWM") * 1024
    result["peak_reset"] = reset_peak_rss()


def finish_rss(result: dict[str, Any], device: str) -> None:
    import torch

    result["route_peak_rss"] = proc_status_kib("VmHWM") * 1024
    if device.startswith("cuda"):
        result["device_peak_bytes"] = torch.cuda.max_memory_allocated()


def weight_bytes(module: Any) -> int:
    """Stored weight bytes, tied tensors once; the int8 trial mode's packed weights are tuples of tensors."""
    import torch

    seen, total = set(), 0
    stack = list(module.state_dict().values())
    while stack:
        value = stack.pop()
        if isinstance(value, (tuple, list)):
            stack.extend(value)
        elif isinstance(value, torch.Tensor) and value.data_ptr() not in seen:
            seen.add(value.data_ptr())
            total += value.numel() * value.element_size()
    return total


def profile_top_ops(run: Callable[[], Any], top: int = 10) -> list[dict[str, Any]]:
    """The ops (CPU) or kernels (GPU) with the most self time in one call of `run`: where time goes."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        run()
    on_gpu = ProfilerActivity.CUDA in activities
    events = list(prof.key_averages())
    if on_gpu:  # the kernels only: an op's self device time repeats its kernels' time
        events = [e for e in events if e.device_type != torch.autograd.DeviceType.CPU] or events
    key = (lambda e: e.self_device_time_total) if on_gpu else (lambda e: e.self_cpu_time_total)
    total = sum(key(e) for e in events) or 1
    events.sort(key=key, reverse=True)
    return [{"op": e.key, "calls": e.count, "share": key(e) / total, "ms": key(e) / 1e3} for e in events[:top]]
