"""One client's round as a value: :class:`Fit` flows through a method's client hooks
(``prepare`` -> ``local_update`` -> ``reply`` -> ``client_state``, and every ``loss`` call), so a
method object holds no client's state between them and a loss is a function of its arguments.

A local update is a list of :class:`Stage` s (FedAvg: one; FedRep and ProtoHAR: the head, then the
body). The same stages run client by client (``FedAvg.fit``) or for a round's clients at once
(``FedAvg.fit_many`` through :func:`fedwear.methods.together.train_together`); both record what a
stage asks (:func:`record`) the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from fedwear.methods.api import Record
from fedwear.seeding import derive_seed

if TYPE_CHECKING:
    from torch import nn

    from fedwear.data.types import ClientData

#: A stage's objective: ``loss(model, x, y, fit)`` -> the batch's mean loss, or ``(loss, (z, key))``
#: with each window's embedding ``z`` ``[B, k]`` and prototype key ``[B]`` for a stage that records
#: them. It reads the client's values from ``fit.inputs`` only, and changes nothing.
StageLoss = Callable[["nn.Module", torch.Tensor, torch.Tensor, "Fit"], Any]
#: What a stage records per prototype key: the first embedding seen (ProtoHAR's code,
#: cheng-haha/ProtoHAR userProtoHAR.py) or the sum of the last epoch's (FedProto's code,
#: ``update_weights_het``).
Recording = Literal["first", "last_epoch"]


@dataclass(frozen=True)
class Stage:
    """One optimiser's epochs over some model parts with one objective."""

    optimizer: str  # its name in the client state (``optim.<name>.``): "model", "head", "body"
    parts: tuple[str, ...]  # the parts it trains; the others are frozen
    loss: StageLoss
    epochs: int
    lr: float | None = None  # None: the config's optimizer.lr
    seed: str | None = None  # the batch order's seed is ``derive_seed(fit.seed, seed)`` when set
    record: Recording | None = None
    num_keys: int = 0  # prototype keys the recording holds

    def batch_seed(self, fit: Fit) -> int:
        """The seed of the client's batch order in this stage."""
        return fit.seed if self.seed is None else derive_seed(fit.seed, self.seed)


@dataclass
class Fit:
    """One client's round. ``inputs`` are the tensors its losses read (global prototypes, a proximal
    anchor, reference weights): training clients together stacks them client by client, so they
    have the same names and shapes for every client of a round. ``notes`` hold what else the
    method hands from one hook to the next (numpy arrays, numbers)."""

    down: Record
    state: Record
    data: ClientData | None
    seed: int
    round: int = 0
    model: Any = None  # the model trained: the method's one model object, loaded by ``prepare``
    inputs: dict[str, Any] = field(default_factory=dict)
    #: Added to each (clipped) gradient before a step, by parameter name (SCAFFOLD's c - c_i).
    correction: dict[str, torch.Tensor] | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    loss: float = math.nan  # the last stage's mean loss over its steps
    steps: int = 0  # optimiser steps taken, every stage
    step_sizes: float = 0.0  # sum over the steps of lr / (1 - momentum) (SCAFFOLD's K eta_l)
    #: The optimisers' state to keep (``optim.<name>.`` arrays), from each stage's optimiser.
    optimizer_state: dict[str, np.ndarray] = field(default_factory=dict)
    #: A recording stage's embeddings per key ``[Q, k]`` and its counts ``[Q]`` (1 per key seen
    #: for "first"), on the model's device.
    recorded: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def of_inputs(inputs: dict[str, Any]) -> Fit:
        """A fit holding only ``inputs``: what a loss sees when clients train together."""
        return Fit(Record(), Record(), None, 0, inputs=inputs)


def mean_loss(out: Any) -> torch.Tensor:
    """The loss of a :data:`StageLoss` answer (without its recorded embeddings)."""
    return out[0] if isinstance(out, tuple) else out


def record(kind: Recording, embeddings: torch.Tensor, seen: torch.Tensor, z: torch.Tensor, key: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``embeddings`` ``[K, Q, k]`` and ``seen`` ``[K, Q]`` after K clients' batches ``z``
    ``[K, B, k]`` with keys ``[K, B]``: "first" adds each key's first embedding not seen before
    (exactly: one 0/1 weight per key), "last_epoch" adds every embedding to its key's float64 sum,
    window after window as ``index_add_`` adds them, and counts it. No value is read back to the
    host."""
    clients, keys = seen.shape
    if kind == "first":
        onehot = F.one_hot(key, keys)
        new = (onehot.cumsum(1) == 1) & onehot.bool() & (seen == 0).unsqueeze(1)
        return (embeddings + torch.einsum("kbq,kbd->kqd", new.to(z.dtype), z.detach()),
                seen + new.any(1).to(seen.dtype))
    rows = (key + keys * torch.arange(clients, device=key.device).unsqueeze(1)).reshape(-1)
    sums = embeddings.reshape(clients * keys, -1).index_add(0, rows, z.detach().reshape(rows.numel(), -1).double())
    counts = seen.reshape(-1).index_add(0, rows, torch.ones(rows.numel(), dtype=seen.dtype, device=seen.device))
    return sums.reshape(embeddings.shape), counts.reshape(seen.shape)


class Recorder:
    """A stage's recording for one client trained alone (``FedAvg.run_stage``): ``see`` each
    batch's loss answer, ``end_epoch`` after each epoch, ``close`` into ``fit.recorded``."""

    def __init__(self, stage: Stage, fit: Fit) -> None:
        self.stage, self.fit, self.epoch = stage, fit, 0
        self.state: tuple[torch.Tensor, torch.Tensor] | None = None

    def see(self, out: Any) -> torch.Tensor:
        kind = self.stage.record
        if kind is None or not isinstance(out, tuple):
            return mean_loss(out)
        loss, (z, key) = out
        if kind == "first" or self.epoch == self.stage.epochs - 1:
            if self.state is None:
                self.state = empty_recording(kind, 1, self.stage.num_keys, z.shape[-1], z)
            self.state = record(kind, *self.state, z.unsqueeze(0), key.unsqueeze(0))
        return loss

    def end_epoch(self) -> None:
        self.epoch += 1

    def close(self) -> None:
        if self.state is not None:
            self.fit.recorded = (self.state[0][0], self.state[1][0])


def empty_recording(kind: Recording, clients: int, keys: int, dim: int, like: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = torch.float64 if kind == "last_epoch" else like.dtype
    return (torch.zeros(clients, keys, dim, dtype=dtype, device=like.device),
            torch.zeros(clients, keys, dtype=torch.float64, device=like.device))


__all__ = ["Fit", "Recorder", "Recording", "Stage", "StageLoss", "empty_recording", "mean_loss", "record"]
