"""Shared client-side machinery: model <-> arrays, optimisers, the local training loop."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from fedwear.methods.api import Record
from fedwear.methods.host_sync import step_guard

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def host(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array on the host (a view on the CPU, a copy from a GPU)."""
    return t.detach().cpu().numpy()


def model_arrays(model: nn.Module, parts: Iterable[str]) -> dict[str, np.ndarray]:
    """State-dict entries (parameters and buffers) of the named parts, as numpy copies."""
    prefixes = tuple(f"{p}." for p in parts)
    return {
        k: v.detach().cpu().numpy().copy()
        for k, v in model.state_dict().items()
        if k.startswith(prefixes)
    }


def load_arrays(model: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Copy arrays into the model in place (names are state-dict keys; others are ignored)."""
    state = model.state_dict()
    with torch.no_grad():
        for k, a in arrays.items():
            if k in state:
                state[k].copy_(torch.from_numpy(np.asarray(a)))


def strip(arrays: dict, prefix: str) -> dict:
    """The entries of ``arrays`` under ``prefix``, named without it (a part's own state-dict names)."""
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


def reference_outputs(module: nn.Module, weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` with ``weights`` (names of its state dict: parameters and buffers) in place of
    its own, in eval mode, without gradient: a frozen reference model (MOON's global and previous
    models, a distillation teacher) that needs no model object of its own, so a loss using it
    stays a function of its inputs and trains together."""
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            return functional_call(module, weights, (x,))
    finally:
        module.train(was)


def part_parameters(model: nn.Module, parts: Iterable[str]) -> list[nn.Parameter]:
    prefixes = tuple(f"{p}." for p in parts)
    return [p for n, p in model.named_parameters() if n.startswith(prefixes)]


def make_optimizer(
    params: list[nn.Parameter], name: str, lr: float, momentum: float, weight_decay: float, eps: float = 1e-8
) -> torch.optim.Optimizer:
    """torch's optimiser ``name``; Adam and AdamW use torch's fused kernel, which updates all
    parameters in one pass: 3-8x less CPU per step than the per-parameter loop on fedwear's
    models (``benchmarks/step_overheads.py``), the same update up to float rounding."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, eps=eps, fused=True)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, eps=eps, fused=True)
    raise ValueError(f"unknown optimizer {name!r}")


@dataclass
class LocalOptimizer:
    """A named optimiser (and its learning-rate scheduler) over one group of parameters.

    Its state persists in a client state under ``optim.<name>.``, so a method can keep several
    (ProtoHAR and FedRep: ``head`` and ``body``) without their states colliding.
    """

    name: str
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None

    @property
    def prefix(self) -> str:
        return f"optim.{self.name}."

    def end_epoch(self) -> None:
        """Schedulers step once per local epoch (PCFedH's StepLR, as pcfedh/pcfedh steps it)."""
        if self.scheduler is not None:
            self.scheduler.step()

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Optimiser state (momentum buffers, Adam moments, step) and the scheduler's epoch."""
        out = {}
        for idx, st in self.optimizer.state_dict()["state"].items():
            for key, value in st.items():
                if torch.is_tensor(value):
                    out[f"{self.prefix}{idx}.{key}"] = value.detach().cpu().numpy().copy()
        if self.scheduler is not None:
            out[f"{self.prefix}scheduler.last_epoch"] = np.array(self.scheduler.last_epoch, np.int64)
        return out

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        state: dict[int, dict[str, torch.Tensor]] = {}
        last_epoch = None
        for name, a in arrays.items():
            if not name.startswith(self.prefix):
                continue
            idx, key = name[len(self.prefix) :].split(".", 1)
            if idx == "scheduler":
                last_epoch = int(a)
            else:
                state.setdefault(int(idx), {})[key] = torch.from_numpy(np.array(a))
        if state:
            sd = self.optimizer.state_dict()
            sd["state"] = state
            self.optimizer.load_state_dict(sd)
        if last_epoch is not None and self.scheduler is not None:
            with warnings.catch_warnings():  # replaying steps, not skipping optimiser steps
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
                for _ in range(last_epoch):
                    self.scheduler.step()


#: The dtype forward passes run in under autocast (``precision: bf16``), or None: the weights'
#: own. A process setting, as torch's TF32 flags are: :func:`fedwear.engines.process.prepare_process`.
_AUTOCAST: torch.dtype | None = None


def set_autocast(dtype: torch.dtype | None) -> None:
    global _AUTOCAST
    _AUTOCAST = dtype


def autocast(device: torch.device | str) -> contextlib.AbstractContextManager:
    """Autocast to the process's precision on ``device`` (a no-op in fp32 and tf32)."""
    if _AUTOCAST is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, _AUTOCAST)


Hook = Callable[[], None]
#: Called as ``hook(step, planned)`` after every optimiser step of :func:`train_epochs` run in this
#: context (``step`` of ``planned`` steps of that call): the in-process engine sets it around a
#: client's fit, for the progress bar and its estimates (``Callback.on_step``).
STEP_HOOK: ContextVar[Callable[[int, int], None] | None] = ContextVar("fedwear_step_hook", default=None)


def train_epochs(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
    loss_fn: LossFn,
    clip: float | None = None,
    shuffle: bool = True,
    before_step: Hook | None = None,
    after_step: Hook | None = None,
    after_epoch: Hook | None = None,
    drop_last: bool = False,
) -> float:
    """Mini-batch training: reshuffled every epoch (unless ``shuffle`` is off), last partial batch
    kept, or skipped with ``drop_last`` (Meta-HAR's and FedMAT's loaders, Chain123/Meta-HAR met-har.py and Super-Shen/FedMAT iLog_train.py: a
    client with fewer windows than one batch then takes no step, though ``after_epoch`` still
    runs each epoch). ``before_step`` runs after backward (and clipping), ``after_step`` after
    each optimiser step, ``after_epoch`` after each epoch. Returns the mean loss over the steps;
    NaN ("no training loss") when no step was taken: ``epochs=0``, no train window, or
    ``drop_last`` with fewer windows than one batch; inf when a step's loss was not finite (the
    model diverged: the round loop warns). The forward pass runs under :func:`autocast`.
    The batch order is drawn on the CPU (the same on every device) and the losses are summed
    where they are, so a GPU waits for nothing inside the loop."""
    model.train()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    n = len(y)
    end = n - n % batch_size if drop_last else n  # the permutation is drawn in full either way
    total, steps = torch.zeros((), dtype=torch.float64, device=x.device), 0  # float64: as Python's float sum
    step_hook = STEP_HOOK.get()
    planned = epochs * -(-end // batch_size)
    for _ in range(epochs):
        order = (torch.randperm(n, generator=generator) if shuffle else torch.arange(n)).to(x.device)
        for start in range(0, end, batch_size):
            with step_guard():
                idx = order[start : start + batch_size]
                with autocast(x.device):
                    loss = loss_fn(model, x[idx], y[idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if clip:
                    nn.utils.clip_grad_norm_(params, clip)
                if before_step is not None:
                    before_step()
                optimizer.step()
                if after_step is not None:
                    after_step()
                total += loss.detach().double()
            steps += 1
            if step_hook is not None:
                step_hook(steps, planned)
        if after_epoch is not None:
            after_epoch()
    if not steps:
        return float("nan")
    mean = float(total) / steps
    return mean if math.isfinite(mean) else float("inf")  # a NaN or inf loss on a step taken: diverged


def weighted_mean(replies: Iterable[Record], keys: Iterable[str], weight: str = "num_examples") -> dict[str, np.ndarray]:
    """Sample-weighted mean of named arrays (FedAvg, McMahan et al. 2017, Alg. 1)."""
    replies = list(replies)
    w = np.array([float(r.scalars[weight]) for r in replies], dtype=np.float64)
    w = w / w.sum()
    out = {}
    for k in keys:
        acc = sum(wi * r.arrays[k].astype(np.float64) for wi, r in zip(w, replies, strict=True))
        out[k] = np.asarray(acc, dtype=replies[0].arrays[k].dtype)
    return out
