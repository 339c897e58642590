"""Process settings for training speed, applied once by every engine before client work."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

import torch

log = logging.getLogger("fedwear")

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_applied = False


def keep_freed_buffers(mmap_threshold: int = 256 << 20, trim_threshold: int = 512 << 20) -> bool:
    """Let glibc reuse freed tensor buffers instead of returning them to the kernel.

    By default glibc serves blocks above a dynamic threshold (128 KB to 32 MB) with ``mmap``
    and unmaps them on free, so every training step's activations (~25 MB a HARCNN batch)
    are fresh pages: ~10k page faults a step and ~15% of a round's CPU in the kernel
    (``benchmarks/speed.py`` reports system time and faults). Raising both thresholds keeps
    such blocks in the heap for the next step; peak memory is unchanged, and at most
    ``trim_threshold`` bytes of freed memory stay with the process. Returns False where
    glibc is not the allocator (macOS, musl), which changes nothing.
    """
    global _applied
    if _applied:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    if not _applied:
        log.debug("mallopt refused the thresholds: glibc's defaults stay")
    return _applied


def flush_denormals() -> bool:
    """Treat subnormal floats (below 1.2e-38 in float32) as zero on the calling thread and the
    threads it starts later (x86 FTZ/DAZ), as TensorFlow's CPU kernels do.

    Once a model fits its client's windows (train losses of 1e-6 to 1e-7, as in late rounds of
    ProtoHAR's protocol), the backward pass carries many subnormal gradients, which x86 cores
    handle in slow microcode: flushed, a HARCNN step on such a model took 0.83x the CPU, and
    late SCAFFOLD rounds of ``protohar:table2`` 0.70x (``results/bench_denormals.md``). Values
    that small are below the rounding of any weight they are added to: in both measurements the
    weights and metrics came out bit for bit the same with and without the flush. Returns False
    where the CPU has no such mode.
    """
    return torch.set_flush_denormal(True)


def prepare_process(threads: int | None, precision: str = "fp32", deterministic: bool = False) -> None:
    """torch's thread count (``threads``; None leaves torch's default until :func:`choose_threads`),
    the allocator setting, subnormals flushed to zero, and the run's ``precision`` and
    ``deterministic`` settings (see :func:`set_precision`)."""
    if threads:
        torch.set_num_threads(threads)
    keep_freed_buffers()
    flush_denormals()
    set_precision(precision, deterministic)


def set_precision(precision: str, deterministic: bool) -> None:
    """``precision``: fp32 turns TF32 off on a GPU (torch leaves it on for cuDNN's convolutions
    by default), tf32 turns it on for matmuls and convolutions, bf16 runs forward passes under
    autocast (:func:`fedwear.methods.training.autocast`). ``deterministic``: torch's deterministic
    algorithms, and the cuBLAS workspace they need (set before CUDA starts; an existing value is
    kept)."""
    from fedwear.methods.training import set_autocast

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    set_autocast(torch.bfloat16 if precision == "bf16" else None)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if deterministic != torch.are_deterministic_algorithms_enabled():
        # only on a change: the call imports torch's compiler stack (inductor, dynamo, sympy), 1.5-2.5
        # CPU-s, to set a flag that is off by default. Processes that only evaluate or report skip
        # that; training pays it anyway at its first optimiser (torch.optim imports dynamo).
        torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = False


#: Below this many FLOPs in a training batch (forward + backward), one thread trains faster than
#: several: thread start-up and synchronisation outweigh the split work. Measured by
#: ``benchmarks/threads_choice.py`` (docs/performance.md, "Threads"): the quickstart's cnn (142
#: MFLOP a batch) ran 0.5x as fast on 2 threads and PCFedH's LSTM 0.02x, while HART (1,966) ran
#: 1.24x and HARCNN (5,804) 1.62x as fast.
ONE_THREAD_FLOPS = 1e9


def training_flops(model: torch.nn.Module, window: int, channels: int, batch_size: int) -> float:
    """FLOPs torch counts (matmuls, convolutions) in one training batch of ``model``, forward and
    backward; counted on a copy in eval mode with the RNG state restored, so the model, its
    buffers and the run's random draws stay as they were."""
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    probe = copy.deepcopy(model).eval()
    device = next(probe.parameters()).device
    with torch.random.fork_rng(devices=[]), FlopCounterMode(display=False) as counter:
        out = probe(torch.zeros(2, window, channels, device=device))
        (out if torch.is_tensor(out) else out[0]).float().sum().backward()
    return counter.get_total_flops() / 2 * batch_size


def choose_threads(model: torch.nn.Module | None, window: int, channels: int, batch_size: int) -> int:
    """``threads: null``: one thread for a training batch under :data:`ONE_THREAD_FLOPS`, else
    torch's default (every core). Chosen from the work, never from the machine's load, since
    the thread count can change float rounding: the same config on the same machine always runs
    with the same threads. Sets and returns torch's thread count."""
    if model is not None and training_flops(model, window, channels, batch_size) < ONE_THREAD_FLOPS:
        torch.set_num_threads(1)
    return torch.get_num_threads()
