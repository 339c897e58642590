"""Several clients' local training as one computation: ``torch.func.vmap`` over stacked weights.

FedAvg's local step (:func:`fedwear.methods.training.train_epochs` with cross-entropy, gradient
clipping and SGD) for K clients at once. Each client keeps its own data, batch order (the same
generator draws as training it alone), step count, clipping and momentum; a step's K mini-batches
go through the model together, so the per-step cost of a small model is paid once per round
instead of once per client. Clients whose data is exhausted are masked out of later steps. The
results equal training each client alone up to float rounding (tested in
``tests/test_batched.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.utils.flop_counter import FlopCounterMode


@dataclass
class ClientJob:
    """One client's training: starting weights (every model parameter), data, seed, momentum."""

    weights: dict[str, torch.Tensor]
    x: torch.Tensor
    y: torch.Tensor
    seed: int
    momentum: dict[str, torch.Tensor] | None = None  # persisted SGD buffers by parameter name


@dataclass
class ClientResult:
    weights: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    loss: float  # mean over the client's steps, as train_epochs returns it


def can_vectorize(model: nn.Module) -> bool:
    """No buffers (BatchNorm statistics) and no dropout: the step is a pure function of the
    weights and the batch, which vmap needs to reproduce the one-client result. No recurrent
    layers: vmap runs ``nn.LSTM``/``nn.GRU`` one client at a time through a fallback (slower than
    the plain loop, measured in docs/performance.md)."""
    return not list(model.buffers()) and not any(
        isinstance(m, (nn.modules.dropout._DropoutNd, nn.RNNBase)) for m in model.modules())


def train_flops_per_window(model: nn.Module, window: int, channels: int, num_classes: int) -> float:
    """Forward + backward FLOPs of one window of a training step (batch of 8, counted by torch)."""
    device = next(model.parameters()).device
    x = torch.zeros(8, window, channels, device=device)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), torch.zeros(8, dtype=torch.long, device=device)).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / 8


def _schedule(jobs: list[ClientJob], epochs: int, batch_size: int, shuffle: bool) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Per step and client, the rows of the stacked data (padded) and a mask of real rows."""
    per_client, offset, counts = [], 0, []
    for job in jobs:
        n = len(job.y)
        g = torch.Generator().manual_seed(job.seed)
        batches = []
        for _ in range(epochs):
            order = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
            batches += [order[s : s + batch_size] + offset for s in range(0, n, batch_size)]
        per_client.append(batches)
        counts.append(len(batches))
        offset += n
    steps = max(counts, default=0)
    index = torch.full((steps, len(jobs), batch_size), offset, dtype=torch.long)  # row `offset` = padding
    mask = torch.zeros(steps, len(jobs), batch_size)
    for k, batches in enumerate(per_client):
        for s, b in enumerate(batches):
            index[s, k, : len(b)] = b
            mask[s, k, : len(b)] = 1.0
    return index, mask, counts


def train_together(
    model: nn.Module,
    jobs: list[ClientJob],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    weight_decay: float,
    clip: float | None,
    shuffle: bool = True,
    regression: bool = False,
    proximal: float = 0.0,
) -> list[ClientResult]:
    """Train every job's weights as ``train_epochs`` + ``torch.optim.SGD`` would, all at once.

    SGD as torch computes it: ``g += wd * w``; ``buf = g`` on a client's first step without a
    persisted buffer, else ``buf = momentum * buf + g``; ``w -= lr * buf``. Clipping as
    ``clip_grad_norm_``: each client's gradients scaled by ``min(1, clip / (norm + 1e-6))``.
    The loss is cross-entropy, or with ``regression`` the squared error of the single output,
    plus with ``proximal`` = mu > 0 FedProx's term ``mu / 2 ||w - w_start||^2`` (Li et al. 2020,
    Eq. 2; ``w_start`` the job's starting weights, the global model). Everything runs on the
    model's device; the batch order is drawn on the CPU, as for one client.
    """
    names = [n for n, _ in model.named_parameters()]
    device = next(model.parameters()).device
    x = torch.cat([j.x for j in jobs] + [torch.zeros_like(jobs[0].x[:1])]).to(device)
    y = torch.cat([j.y for j in jobs] + [torch.zeros_like(jobs[0].y[:1])]).to(device)
    index, mask, counts = _schedule(jobs, epochs, batch_size, shuffle)
    index, mask = index.to(device), mask.to(device)
    w = {n: torch.stack([j.weights[n] for j in jobs]).float().to(device) for n in names}
    anchor = dict(w)  # the starting weights (``w``'s entries are replaced, never changed in place)
    fresh = torch.tensor([j.momentum is None for j in jobs], device=device)
    buf = {n: torch.stack([torch.zeros_like(j.weights[n]) if j.momentum is None else j.momentum[n]
                           for j in jobs]).to(device) for n in names}
    model.train()

    def loss_of(params: dict[str, torch.Tensor], start: dict[str, torch.Tensor], xb: torch.Tensor,
                yb: torch.Tensor, mb: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, params, (xb,))
        if regression:
            per_window = (out.squeeze(-1) - yb) ** 2
        else:
            per_window = F.cross_entropy(out, yb, reduction="none")
        loss = (per_window * mb).sum() / mb.sum().clamp(min=1.0)
        if proximal:
            loss = loss + 0.5 * proximal * sum(((params[n] - start[n]) ** 2).sum() for n in names)
        return loss

    step_fn = vmap(grad_and_value(loss_of))
    total = torch.zeros(len(jobs), device=device)
    for s in range(index.shape[0]):
        rows, mb = index[s], mask[s]
        active = mb.sum(1) > 0
        grads, loss = step_fn(w, anchor, x[rows], y[rows], mb)
        with torch.no_grad():
            total += torch.where(active, loss, torch.zeros_like(loss))
            if clip:
                norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()], dim=1).norm(dim=1)
                coef = (clip / (norms + 1e-6)).clamp(max=1.0)
            for n in names:
                g = grads[n]
                if clip:
                    g = g * coef.view(-1, *[1] * (g.dim() - 1))
                if weight_decay:
                    g = g + weight_decay * w[n]
                if momentum:
                    first = (fresh & (s == 0)).view(-1, *[1] * (g.dim() - 1))
                    g = torch.where(first, g, momentum * buf[n] + g)
                    buf[n] = torch.where(active.view_as(first), g, buf[n])
                w[n] = torch.where(active.view(-1, *[1] * (g.dim() - 1)), w[n] - lr * g, w[n])
    total = total.cpu()
    return [
        ClientResult({n: w[n][k] for n in names}, {n: buf[n][k] for n in names} if momentum else {},
                     float(total[k]) / counts[k] if counts[k] else float("nan"))
        for k in range(len(jobs))
    ]
