"""Several clients' local training as one computation: ``torch.func.vmap`` over stacked weights.

A local step (:func:`fedwear.methods.training.train_epochs` with SGD, gradient clipping and the
task's loss) for K clients at once. Each client keeps its own data, batch order (the same
generator draws as training it alone), step count, clipping and momentum; a step's K mini-batches
go through the model together, so the per-step cost of a small model is paid once per round
instead of once per client. Clients whose data is exhausted are masked out of later steps.

Beyond FedAvg's step it takes what the other vectorised steps need: a subset of the parameters
trained (FedRep's and ProtoHAR's head and body steps), FedProx's proximal term, a pull of the
embeddings toward global prototypes (ProtoHAR Eq. 6, FedProto Alg. 1) and a record of the
embeddings the steps saw (each class's first one: ProtoHAR's code; the last epoch's per-class
sums: FedProto, Eq. 3). The results equal training each client alone up to float rounding
(tested in ``tests/test_batched.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
    momentum: dict[str, torch.Tensor] | None = None  # persisted SGD buffers by (trained) parameter name
    keys: torch.Tensor | None = None  # each window's prototype: its class (default) or target bin
    #: Added to each clipped gradient before the step, by parameter name (SCAFFOLD's c - c_i).
    correction: dict[str, torch.Tensor] | None = None
    #: Weights of the models a ``Contrast`` compares against: the positive, then the negative.
    references: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None


@dataclass
class ClientResult:
    weights: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    loss: float  # mean over the client's steps, as train_epochs returns it
    steps: int  # optimiser steps taken
    #: With ``record``: per prototype key ``[Q, k]``, the first embedding seen ("first") or the
    #: sum of the last epoch's embeddings in float64 ("last_epoch"), and ``[Q]`` how many.
    embeddings: torch.Tensor | None = None
    seen: torch.Tensor | None = None


@dataclass
class Pull:
    """``weight * L_R(z, P[key])`` added to the loss: the embedding ``z`` of each window pulled
    toward its key's global prototype (ProtoHAR Eq. 6, FedProto's regulariser), a window whose key
    has no prototype toward itself (no pull, but it counts in the mean:
    :func:`fedwear.methods.prototypes.targets`). ``distance`` as
    :func:`fedwear.methods.prototypes.distance`."""

    prototypes: torch.Tensor  # [Q, k]
    mask: torch.Tensor  # [Q]
    weight: float
    distance: Literal["l2", "l1", "cosine"] = "l2"

    def per_window(self, z: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        has = self.mask[key].bool().unsqueeze(-1)
        target = torch.where(has, self.prototypes[key], z.detach())
        if self.distance == "l2":
            return ((z - target) ** 2).mean(-1)
        if self.distance == "l1":
            return (z - target).abs().mean(-1)
        return 1 - F.cosine_similarity(z, target, dim=-1)


@dataclass
class Contrast:
    """``weight * l_con`` added to the loss: MOON's model-contrastive term (Li et al. 2021, Eq. 3),
    ``-log(exp(cos(z, z+) / tau) / (exp(cos(z, z+) / tau) + exp(cos(z, z-) / tau)))`` per window,
    ``z+`` and ``z-`` the window's embeddings under the job's two ``references`` (MOON: the
    global model and the client's previous one), taken without gradient."""

    weight: float
    temperature: float

    def per_window(self, z: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        logits = torch.stack([F.cosine_similarity(z, positive, dim=-1),
                              F.cosine_similarity(z, negative, dim=-1)], dim=-1) / self.temperature
        return torch.logsumexp(logits, dim=-1) - logits[..., 0]


class _Embedded(nn.Module):
    """``model`` answering ``(features(x), head(features(x)))``: the embedding and the output."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.model.features(x)
        return z, self.model.head(z)


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


def _first_seen(index: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor
                ) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Where each client meets each of its keys first, by step: ``{step: (client, position,
    key)}``, read off the batch schedule on the CPU so the steps never wait to find out."""
    found: dict[int, list[tuple[int, int, int]]] = {}
    for k in range(index.shape[1]):
        steps, positions = mask[:, k].nonzero(as_tuple=True)  # step-major: the order training sees
        row_keys = keys[index[steps, k, positions]].tolist()
        firsts: dict[int, int] = {}
        for n, key in enumerate(row_keys):
            firsts.setdefault(key, n)
        for key, n in firsts.items():
            found.setdefault(int(steps[n]), []).append((k, int(positions[n]), key))
    return {s: tuple(torch.tensor(col) for col in zip(*hits, strict=True)) for s, hits in found.items()}


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
    trained: list[str] | None = None,
    pull: Pull | None = None,
    contrast: Contrast | None = None,
    record: Literal["first", "last_epoch"] | None = None,
    num_keys: int = 0,
) -> list[ClientResult]:
    """Train every job's weights as ``train_epochs`` + ``torch.optim.SGD`` would, all at once.

    SGD as torch computes it: ``g += wd * w``; ``buf = g`` on a client's first step without a
    persisted buffer, else ``buf = momentum * buf + g``; ``w -= lr * buf``. Clipping as
    ``clip_grad_norm_``: each client's gradients scaled by ``min(1, clip / (norm + 1e-6))``; a
    job's ``correction`` is added after clipping (SCAFFOLD's ``c - c_i``, Karimireddy et al. 2020,
    Alg. 1 line 10). Only the ``trained`` parameters (default: all) take steps; the others stay
    as each job gave them (a frozen part).

    The loss is cross-entropy, or with ``regression`` the squared error of the single output,
    plus with ``proximal`` = mu > 0 FedProx's term ``mu / 2 ||w - w_start||^2`` (Li et al. 2020,
    Eq. 2; ``w_start`` the job's starting weights, the global model), plus the prototype
    ``pull``, plus the ``contrast`` against each job's ``references``.

    ``record`` keeps, per client and prototype key (``num_keys`` of them), the embedding of the
    key's first window ("first", from the forward pass before the step, as ProtoHAR's code takes
    it) or the sum of the last epoch's embeddings ("last_epoch", FedProto's code). Everything
    runs on the model's device; the batch order is drawn on the CPU, as for one client.
    """
    names = [n for n, _ in model.named_parameters()]
    trained = names if trained is None else [n for n in names if n in set(trained)]
    frozen = [n for n in names if n not in set(trained)]
    device = next(model.parameters()).device
    x = torch.cat([j.x for j in jobs] + [torch.zeros_like(jobs[0].x[:1])]).to(device)
    y = torch.cat([j.y for j in jobs] + [torch.zeros_like(jobs[0].y[:1])]).to(device)
    keys = torch.cat([j.y if j.keys is None else j.keys for j in jobs] + [torch.zeros(1, dtype=torch.long)])
    index, mask, counts = _schedule(jobs, epochs, batch_size, shuffle)
    embedded = pull is not None or record is not None or contrast is not None
    net = _Embedded(model) if embedded else model
    prefix = "model." if embedded else ""
    last: list[bool] = []
    if record == "first":
        firsts = {s: tuple(t.to(device) for t in hit) for s, hit in _first_seen(index, mask, keys).items()}
    elif record == "last_epoch":  # each client's final ceil(n / batch_size) steps
        per_epoch = [counts[k] // epochs if epochs else 0 for k in range(len(jobs))]
        in_last = torch.tensor([[counts[k] - per_epoch[k] <= s < counts[k] for k in range(len(jobs))]
                                for s in range(index.shape[0])], dtype=torch.float64).reshape(-1, len(jobs))
        last = in_last.any(1).tolist()
        in_last = in_last.to(device)
    index, mask, keys = index.to(device), mask.to(device), keys.to(device)
    # Each job's tensors may sit on the host (from a client's state) or on the device (FedRep's
    # body step starts from its head step's results), so each goes to the device before stacking.
    w = {n: torch.stack([j.weights[n].to(device) for j in jobs]).float() for n in names}
    anchor = dict(w)  # the starting weights (``w``'s entries are replaced, never changed in place)
    fresh = torch.tensor([j.momentum is None for j in jobs], device=device)
    buf = {n: torch.stack([(torch.zeros_like(j.weights[n]) if j.momentum is None else j.momentum[n]).to(device)
                           for j in jobs]) for n in trained}
    corrected = any(j.correction is not None for j in jobs)
    if corrected:
        correction = {n: torch.stack([(j.correction or {}).get(n, torch.zeros_like(j.weights[n])).to(device)
                                      for j in jobs]) for n in trained}
    positive, negative = (  # the references' weights, stacked as ``w``
        tuple({n: torch.stack([j.references[r][n].to(device) for j in jobs]).float() for n in names} for r in (0, 1))
        if contrast is not None else ({}, {}))
    model.train()

    def loss_of(params: dict[str, torch.Tensor], fixed: dict[str, torch.Tensor], start: dict[str, torch.Tensor],
                pos: dict[str, torch.Tensor], neg: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor,
                kb: torch.Tensor, mb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def embed(weights: dict[str, torch.Tensor]):
            return functional_call(net, {prefix + n: t for n, t in weights.items()}, (xb,))

        out = embed({**fixed, **params})
        z, out = out if embedded else (out, out)
        if regression:
            per_window = (out.squeeze(-1) - yb) ** 2
        else:
            per_window = F.cross_entropy(out, yb, reduction="none")
        if pull is not None and pull.weight:
            per_window = per_window + pull.weight * pull.per_window(z, kb)
        if contrast is not None:
            z_pos, z_neg = embed(pos)[0].detach(), embed(neg)[0].detach()
            per_window = per_window + contrast.weight * contrast.per_window(z, z_pos, z_neg)
        loss = (per_window * mb).sum() / mb.sum().clamp(min=1.0)
        if proximal:
            loss = loss + 0.5 * proximal * sum(((params[n] - start[n]) ** 2).sum() for n in trained)
        return loss, z.detach() if embedded else loss.new_zeros(())

    step_fn = vmap(grad_and_value(loss_of, has_aux=True))
    total = torch.zeros(len(jobs), device=device)
    embeddings = seen = None
    for s in range(index.shape[0]):
        rows, mb = index[s], mask[s]
        active = mb.sum(1) > 0
        grads, (loss, z) = step_fn({n: w[n] for n in trained}, {n: w[n] for n in frozen},
                                   {n: anchor[n] for n in trained}, positive, negative, x[rows], y[rows], keys[rows], mb)
        with torch.no_grad():
            if record is not None and embeddings is None:
                dtype = torch.float64 if record == "last_epoch" else z.dtype
                embeddings = torch.zeros(len(jobs), num_keys, z.shape[-1], dtype=dtype, device=device)
                seen = torch.zeros(len(jobs), num_keys, dtype=torch.float64, device=device)
            if record == "first" and s in firsts:
                client, position, key = firsts[s]
                embeddings[client, key] = z[client, position]
                seen[client, key] = 1.0
            elif record == "last_epoch" and last[s]:
                hit = F.one_hot(keys[rows], num_keys).double() * (mb.double() * in_last[s].unsqueeze(1)).unsqueeze(-1)
                embeddings += torch.einsum("kbq,kbd->kqd", hit, z.double())
                seen += hit.sum(1)
            total += torch.where(active, loss, torch.zeros_like(loss))
            if clip:
                norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()], dim=1).norm(dim=1)
                coef = (clip / (norms + 1e-6)).clamp(max=1.0)
            for n in trained:
                g = grads[n]
                if clip:
                    g = g * coef.view(-1, *[1] * (g.dim() - 1))
                if corrected:
                    g = g + correction[n]
                if weight_decay:
                    g = g + weight_decay * w[n]
                if momentum:
                    first = (fresh & (s == 0)).view(-1, *[1] * (g.dim() - 1))
                    g = torch.where(first, g, momentum * buf[n] + g)
                    buf[n] = torch.where(active.view_as(first), g, buf[n])
                w[n] = torch.where(active.view(-1, *[1] * (g.dim() - 1)), w[n] - lr * g, w[n])
    total = total.cpu()
    return [
        ClientResult({n: w[n][k] for n in names},
                     # torch's SGD has no buffer until its first step
                     {n: buf[n][k] for n in trained} if momentum and (counts[k] or jobs[k].momentum) else {},
                     float(total[k]) / counts[k] if counts[k] else float("nan"), counts[k],
                     None if embeddings is None else embeddings[k], None if seen is None else seen[k])
        for k in range(len(jobs))
    ]
