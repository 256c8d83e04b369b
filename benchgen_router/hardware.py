"""What the machine can do: CPU features, devices, the dtype and thread count to run with.

bfloat16 is fast only where the hardware has matrix units for it (AMX or avx512_bf16 on a CPU, a
GPU with bf16 support); elsewhere oneDNN emulates it, hundreds of times slower (docs/benchmark.md),
so `auto` never picks it there and asking for it is refused unless forced.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchgen_router.errors import InputError, setting_error

logger = logging.getLogger("benchgen_router")

CPU_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "avx512_fp16")
DTYPES = ("auto", "float32", "bfloat16", "float16")


def cpu_features() -> dict[str, bool]:
    """Which vector and matrix-unit features this CPU reports (Linux /proc/cpuinfo)."""
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return {name: name in flags for name in CPU_FEATURES}


def cpu_summary() -> str:
    """'<model name>, N CPUs (feature, ...)': what every benchmark table names."""
    name = "unknown CPU"
    with contextlib.suppress(OSError, StopIteration):
        line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
        name = line.split(":", 1)[1].strip()
    present = [feature for feature, has in cpu_features().items() if has]
    return f"{name}, {os.cpu_count()} CPUs ({', '.join(present) or 'no avx2/avx512/amx'})"


def bf16_is_fast(device: str = "cpu") -> bool:
    """True where bfloat16 matrix products run on hardware made for them."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    features = cpu_features()
    return features["avx512_bf16"] or features["amx_bf16"]


def check_device(device: str) -> None:
    """One clear line for a device torch does not know or this machine does not have."""
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        raise InputError(f"unknown device '{device}'; use cpu, cuda, cuda:N or mps.") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise setting_error(f"device '{device}' asked for, but torch sees no CUDA GPU here; use {{device=cpu}}.")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise setting_error(f"device '{device}' asked for, but MPS is not available here; use {{device=cpu}}.")


def resolve_device(device: str | None) -> str:
    """None / 'auto' -> 'cuda' when a GPU is visible, else 'cpu'; anything else is checked and kept."""
    if device in (None, "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    check_device(device)
    return device


def resolve_dtype(dtype: Any, device: str, allow_emulated: bool = False) -> Any:
    """What from_pretrained's dtype= gets: None / 'auto' keep the router's own dtype (float32 for
    converted releases, the reference's picks); a name or torch dtype is used as given, except
    bfloat16 on a CPU that would only emulate it, which is refused unless `allow_emulated`."""
    import torch

    if dtype in (None, "auto"):
        return "auto"
    resolved = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise InputError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}.")
    if resolved == torch.bfloat16 and torch.device(device).type == "cpu" and not bf16_is_fast("cpu"):
        if not allow_emulated:
            raise setting_error(
                "this CPU has neither AMX nor avx512_bf16, so bfloat16 would be emulated (hundreds of times "
                "slower than float32); use {dtype=float32} or auto, or force it with {allow_emulated_bf16}."
            )
        logger.warning("bfloat16 on a CPU without AMX or avx512_bf16: emulated, expect it to be very slow")
    return resolved


def default_batch_tokens(device: Any, dtype: Any) -> int:
    """Positions per forward pass when the caller sets no budget. Longer matrices run the matrix
    units closer to their peak, at the cost of activation memory; these are the budgets the routing
    benchmark measured best: a GPU wants tens of thousands, a CPU a few thousand (float32 reaches
    its peak sooner than bfloat16 on AMX)."""
    import torch

    if torch.device(device).type != "cpu":
        return 32768
    return 2048 if dtype == torch.float32 else 4096


def pass_cost_positions(device: Any) -> int | None:
    """What one more forward pass costs, in padded positions, when padded batches are cut
    (batching.padded_batches). On a CPU a pass reads every weight from memory again: on one thread
    the default router spent about 0.19 ms per position and 4.5 ms per pass, so a cut that saves more
    than 24 positions pays (docs/routing.md). None on a GPU, where a pass is mostly kernel launches
    and the cost is unmeasured: there batches are filled up to the cap, in one linear sweep."""
    import torch

    return 24 if torch.device(device).type == "cpu" else None


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers and Ray narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op threads: the number asked for, else the CPUs this process may use. On
    shared cores the pool's barriers wait for descheduled threads, so a one-CPU replica runs one
    thread (docs/benchmark.md, "Threads")."""
    import torch

    count = threads or available_cpus()
    if count < 1:
        raise InputError(f"threads must be at least 1, got {count}.")
    torch.set_num_threads(count)
    return count


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread for a block of small matrix products (fitting a head, sweeping a rule): extra
    threads only slow them on a busy machine, and one thread keeps the order of sums fixed, so a seed gives
    one result run after run."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
