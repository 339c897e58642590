"""Training steps that never wait for the device: a guard that fails on a host synchronisation.

On a GPU, reading a tensor's value on the host (``.item()``, ``.tolist()``, ``float(t)``,
``if t:``), copying it to the host (``.cpu()``, ``.numpy()``) or an operation whose output size
depends on its values (``nonzero``, ``unique``, ``masked_select``, indexing with a boolean mask)
makes Python wait until the GPU has run everything queued before, so the next launches are not
queued ahead and the GPU idles. :class:`HostSyncGuard` raises :class:`HostSync` on each of these
inside a training step; :data:`STEP_GUARD` switches it on around every step of
:func:`fedwear.methods.training.train_epochs` and :func:`fedwear.methods.together.train_together`
(``tests/test_host_sync.py`` runs every method under it on the CPU; on cuda the gpu tests use
``torch.cuda.set_sync_debug_mode("error")``, which also sees the syncs inside torch's kernels).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar

import torch
from torch.overrides import TorchFunctionMode

#: A context manager factory entered around every training step, or None (the default: no cost).
STEP_GUARD: ContextVar[Callable[[], AbstractContextManager] | None] = ContextVar("fedwear_step_guard", default=None)

#: Set by :func:`host_side`: the code under way works on host tensors by design (PCFedH's crops,
#: drawn from a CPU generator), so reading their values waits for nothing.
_HOST_SIDE: ContextVar[bool] = ContextVar("fedwear_host_side", default=False)

#: Calls that read a tensor's values on the host or whose output size depends on them.
SYNCING = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy,
    torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__index__,
    torch.Tensor.nonzero, torch.nonzero, torch.Tensor.unique, torch.unique, torch.unique_consecutive,
    torch.Tensor.masked_select, torch.masked_select,
}


class HostSync(RuntimeError):
    """A training step read a tensor's value on the host."""


def _boolean_index(index: object) -> bool:
    if isinstance(index, torch.Tensor):
        return index.dtype == torch.bool
    if isinstance(index, tuple | list):
        return any(_boolean_index(i) for i in index)
    return False


class HostSyncGuard(TorchFunctionMode):
    """Raises :class:`HostSync` on a call of :data:`SYNCING` or an index with a boolean mask."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__qualname__", getattr(func, "__name__", str(func)))
        if _HOST_SIDE.get():
            return func(*args, **(kwargs or {}))
        if func in SYNCING or (name.endswith(("__getitem__", "__setitem__")) and len(args) > 1
                               and _boolean_index(args[1])):
            raise HostSync(f"{name} in a training step waits for the device (a host synchronisation)")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def host_side():
    """A block of a training step that works on host tensors by design (the guard lets it read them)."""
    token = _HOST_SIDE.set(True)
    try:
        yield
    finally:
        _HOST_SIDE.reset(token)


@contextlib.contextmanager
def cuda_sync_errors():
    """torch's CUDA sync debug mode set to raise inside the block: every synchronisation with the
    GPU fails, those inside torch's own kernels included (``tests/test_gpu.py``)."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


def step_guard() -> AbstractContextManager:
    """The context to run one training step in: :data:`STEP_GUARD`'s, or nothing."""
    make = STEP_GUARD.get()
    return contextlib.nullcontext() if make is None else make()


__all__ = ["STEP_GUARD", "HostSync", "HostSyncGuard", "cuda_sync_errors", "host_side", "step_guard"]
