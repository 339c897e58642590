"""A stage of several clients' local training as one computation, derived from the method's own
loss: ``torch.func`` (``functional_call``, ``grad_and_value``, ``vmap``) over the stage's
objective, with the clients' weights stacked.

Each client keeps its own data, batch order (the generator draws of training it alone), step
count, clipping, gradient correction and momentum; at each step the clients whose batches have
the same size go through the model together, so a small model's per-step cost is paid once per
round instead of once per client, and each client's loss is the method's mean over its own
batch. The update is ``torch.optim.SGD``'s. The results equal :meth:`FedAvg.fit` up to float
rounding (``tests/test_batched.py``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.utils.flop_counter import FlopCounterMode

from fedwear.methods.fit import Fit, Stage, empty_recording, mean_loss, record
from fedwear.methods.host_sync import step_guard

#: Set while runs train as one population (``fedwear.engines.population``): called as
#: ``train(method, stage, fits, starts)`` in place of ``method.train_together``, it trains the
#: clients with those of the other runs and returns theirs.
POPULATION: ContextVar[Callable | None] = ContextVar("fedwear_population", default=None)


@dataclass
class Client:
    """One client's stage: its fit, the weights it starts from (every parameter, by name), its
    train split, the seed of its batch order and its optimiser's kept momentum (or None)."""

    fit: Fit
    weights: dict[str, torch.Tensor]
    x: torch.Tensor
    y: torch.Tensor
    seed: int
    momentum: dict[str, torch.Tensor] | None


@dataclass(frozen=True)
class SGD:
    """The optimiser and loop settings every client of a stage shares."""

    lr: float
    momentum: float
    weight_decay: float
    clip: float | None
    batch_size: int


@dataclass
class Trained:
    weights: dict[str, torch.Tensor]  # every parameter, trained or frozen
    momentum: dict[str, torch.Tensor]  # trained parameters' buffers (none: no step and none kept)
    loss: float  # mean over the client's steps (NaN: none)
    steps: int


class _Objective(nn.Module):
    """``stage.loss(model, x, y, fit)`` as a module, so ``functional_call`` swaps the model's
    weights for every call the loss makes (``model(x)``, ``model.features``, ``model.head``)."""

    def __init__(self, model: nn.Module, stage: Stage) -> None:
        super().__init__()
        self.model = model
        self.stage = stage

    def forward(self, x: torch.Tensor, y: torch.Tensor, inputs: dict) -> tuple[torch.Tensor, tuple]:
        out = self.stage.loss(self.model, x, y, Fit.of_inputs(inputs))
        if isinstance(out, tuple):
            return out[0], out[1]
        return mean_loss(out), ()


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


def batches(n: int, epochs: int, batch_size: int, seed: int) -> list[tuple[int, torch.Tensor]]:
    """(epoch, rows) of every step, drawn as :func:`fedwear.methods.training.train_epochs` draws them."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for epoch in range(epochs):
        order = torch.randperm(n, generator=g)
        out += [(epoch, order[s:s + batch_size]) for s in range(0, n, batch_size)]
    return out


def _stack(values: list) -> object:
    """Stack the clients' inputs (tensors, or dicts of tensors) along a new first dimension."""
    if isinstance(values[0], dict):
        return {k: _stack([v[k] for v in values]) for k in values[0]}
    return torch.stack(values)


def _take(value: object, sel: torch.Tensor | None) -> object:
    if sel is None:
        return value
    if isinstance(value, dict):
        return {k: _take(v, sel) for k, v in value.items()}
    return value.index_select(0, sel)


@dataclass
class _Group:
    """The clients of one step whose batches have the same size, with every index the step needs,
    made on the host before training and copied to the device once."""

    sel: torch.Tensor | None  # the clients (None: all of them, in order)
    rows: torch.Tensor  # [G, batch]: their batches' rows of the stacked data
    fresh: torch.Tensor | None  # [G]: first step without a kept buffer (None: none is)
    record_at: torch.Tensor | None  # the clients whose step records (None: none)
    record_pick: torch.Tensor | None  # their places in the group (None: all of them)


def _schedule(plans: list[list[tuple[int, torch.Tensor]]], clients: list[Client], stage: Stage,
              device: torch.device) -> list[list[_Group]]:
    """Per step, its groups of clients, all index tensors on ``device`` (pinned and copied without
    waiting on a GPU, so the steps never wait for a copy)."""
    offsets = torch.tensor([0] + [len(c.y) for c in clients]).cumsum(0).tolist()
    every = list(range(len(clients)))
    cuda = torch.device(device).type == "cuda"

    def put(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else (t.pin_memory().to(device, non_blocking=True) if cuda else t)

    steps = []
    for s in range(max(map(len, plans), default=0)):
        sizes: dict[int, list[int]] = defaultdict(list)
        for k, plan in enumerate(plans):
            if s < len(plan):
                sizes[len(plan[s][1])].append(k)
        groups = []
        for ks in sizes.values():
            fresh = [s == 0 and clients[k].momentum is None for k in ks]
            keep = [stage.record == "first" or plans[k][s][0] == stage.epochs - 1 for k in ks]
            at = [k for k, kept in zip(ks, keep, strict=True) if kept]
            groups.append(_Group(
                put(None if ks == every else torch.tensor(ks, dtype=torch.long)),
                put(torch.stack([plans[k][s][1] + offsets[k] for k in ks])),
                put(torch.tensor(fresh) if any(fresh) else None),
                put(torch.tensor(at, dtype=torch.long) if stage.record is not None and at else None),
                put(None if all(keep) else torch.tensor([i for i, kept in enumerate(keep) if kept], dtype=torch.long))))
        steps.append(groups)
    return steps


def train_together(model: nn.Module, stage: Stage, clients: list[Client], sgd: SGD) -> list[Trained]:
    """``stage`` for every client at once, as ``train_epochs`` with ``torch.optim.SGD`` trains one.

    SGD as torch computes it: gradients clipped to ``clip`` over the trained parameters
    (``clip_grad_norm_``), the client's ``fit.correction`` added, ``g += wd * w``; ``buf = g`` on
    the first step without a kept buffer, else ``buf = momentum * buf + g``; ``w -= lr * buf``.
    A recording stage fills each client's ``fit.recorded``; ``fit.steps`` and ``fit.step_sizes``
    grow as in ``FedAvg.train``. Everything runs on the model's device; the batch order is drawn
    on the CPU, as for one client."""
    names = [n for n, _ in model.named_parameters()]
    prefixes = tuple(f"{p}." for p in stage.parts)
    trained = [n for n in names if n.startswith(prefixes)]
    frozen = [n for n in names if not n.startswith(prefixes)]
    device = next(model.parameters()).device
    k_all = len(clients)
    plans = [batches(len(c.y), stage.epochs, sgd.batch_size, c.seed) for c in clients]
    x = torch.cat([c.x for c in clients]).to(device)
    y = torch.cat([c.y for c in clients]).to(device)
    w = {n: torch.stack([c.weights[n].to(device) for c in clients]).float() for n in names}
    buf = {n: torch.stack([(c.momentum[n] if c.momentum is not None else torch.zeros_like(c.weights[n])).to(device)
                           for c in clients]) for n in trained}
    inputs = _stack([c.fit.inputs for c in clients]) if clients[0].fit.inputs else {}
    corrected = any(c.fit.correction for c in clients)
    if corrected:
        correction = {n: torch.stack([(c.fit.correction or {}).get(n, torch.zeros_like(c.weights[n])).to(device)
                                      for c in clients]) for n in trained}
    totals = torch.zeros(k_all, dtype=torch.float64, device=device)
    recording = None
    objective = _Objective(model, stage).train()

    def loss_of(params, fixed, given, xb, yb):
        out, aux = functional_call(objective, {**{"model." + n: t for n, t in fixed.items()},
                                               **{"model." + n: t for n, t in params.items()}}, (xb, yb, given))
        return out, aux

    step_fn = vmap(grad_and_value(loss_of, has_aux=True))
    for groups in _schedule(plans, clients, stage, device):
        for g in groups:
            with step_guard():  # a host synchronisation here fails under the guard (host_sync.py)
                sel = g.sel
                now = {n: _take(w[n], sel) for n in names}  # the group's weights, gathered once for the step
                grads, (loss, aux) = step_fn({n: now[n] for n in trained}, {n: now[n] for n in frozen},
                                             _take(inputs, sel), x[g.rows], y[g.rows])
                with torch.no_grad():
                    if stage.record is not None and aux and g.record_at is not None:
                        z, key = aux
                        if recording is None:
                            recording = empty_recording(stage.record, k_all, stage.num_keys, z.shape[-1], z)
                        if g.record_pick is not None:  # "last_epoch": only the clients in their last epoch
                            z, key = z.index_select(0, g.record_pick), key.index_select(0, g.record_pick)
                        emb, seen = record(stage.record, recording[0].index_select(0, g.record_at),
                                           recording[1].index_select(0, g.record_at), z, key)
                        recording = (recording[0].index_copy(0, g.record_at, emb),
                                     recording[1].index_copy(0, g.record_at, seen))
                    update = _sgd_step({n: now[n] for n in trained}, grads,
                                       {n: _take(buf[n], sel) for n in trained}, g.fresh,
                                       {n: _take(correction[n], sel) for n in trained} if corrected else None, sgd)
                    for n, (new_w, new_buf) in update.items():
                        w[n] = new_w if sel is None else w[n].index_copy(0, sel, new_w)
                        buf[n] = new_buf if sel is None else buf[n].index_copy(0, sel, new_buf)
                    loss = loss.double()
                    totals = totals + loss if sel is None else totals.index_add(0, sel, loss)
    step_size = sgd.lr / (1.0 - sgd.momentum)
    totals = totals.cpu()
    out = []
    for k, (client, plan) in enumerate(zip(clients, plans, strict=True)):
        fit = client.fit
        for _ in plan:  # as FedAvg.train sums them, step by step
            fit.step_sizes += step_size
        fit.steps += len(plan)
        if recording is not None:
            fit.recorded = (recording[0][k], recording[1][k])
        out.append(Trained({n: w[n][k] for n in names},
                           # torch's SGD has no buffer until its first step
                           {n: buf[n][k] for n in trained} if sgd.momentum and (plan or client.momentum) else {},
                           float(totals[k]) / len(plan) if plan else float("nan"), len(plan)))
    return out


def _sgd_step(w: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], buf: dict[str, torch.Tensor],
              first: torch.Tensor | None, correction: dict[str, torch.Tensor] | None, sgd: SGD
              ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """One SGD step of G clients: new weights and momentum buffers by parameter name (``first``:
    which clients take their first step without a kept buffer, None: none)."""
    if sgd.clip:
        norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()], dim=1).norm(dim=1)
        coef = (sgd.clip / (norms + 1e-6)).clamp(max=1.0)
    out = {}
    for n, g in grads.items():
        shape = (-1, *[1] * (g.dim() - 1))
        if sgd.clip:
            g = g * coef.view(shape)
        if correction is not None:
            g = g + correction[n]
        if sgd.weight_decay:
            g = g.add(w[n], alpha=sgd.weight_decay)
        b = buf[n]
        if sgd.momentum:
            b = b * sgd.momentum + g
            g = b if first is None else torch.where(first.view(shape), g, b)
            b = g
        out[n] = (w[n].add(g, alpha=-sgd.lr), b)
    return out


__all__ = ["POPULATION", "SGD", "Client", "Trained", "can_vectorize", "train_flops_per_window", "train_together"]
