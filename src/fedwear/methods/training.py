"""Shared client-side machinery: model <-> arrays, optimisers, the local training loop."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch import nn

from fedwear.methods.api import Record

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


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


def part_parameters(model: nn.Module, parts: Iterable[str]) -> list[nn.Parameter]:
    prefixes = tuple(f"{p}." for p in parts)
    return [p for n, p in model.named_parameters() if n.startswith(prefixes)]


def make_optimizer(
    params: list[nn.Parameter], name: str, lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}")


def optimizer_arrays(opt: torch.optim.Optimizer, prefix: str) -> dict[str, np.ndarray]:
    """Optimiser state (momentum buffers, Adam moments, step) as named arrays."""
    out = {}
    for idx, st in opt.state_dict()["state"].items():
        for key, value in st.items():
            if torch.is_tensor(value):
                out[f"{prefix}{idx}.{key}"] = value.detach().cpu().numpy().copy()
    return out


def load_optimizer_arrays(opt: torch.optim.Optimizer, arrays: dict[str, np.ndarray], prefix: str) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, a in arrays.items():
        if name.startswith(prefix):
            idx, key = name[len(prefix) :].split(".", 1)
            state.setdefault(int(idx), {})[key] = torch.from_numpy(np.array(a))
    if state:
        sd = opt.state_dict()
        sd["state"] = state
        opt.load_state_dict(sd)


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
) -> float:
    """Mini-batch training: reshuffled every epoch, last partial batch kept. Returns the mean loss."""
    model.train()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    n = len(y)
    total, steps = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            loss = loss_fn(model, x[idx], y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip:
                nn.utils.clip_grad_norm_(params, clip)
            optimizer.step()
            total += float(loss.detach())
            steps += 1
    return total / max(steps, 1)


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
