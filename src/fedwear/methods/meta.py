"""What Meta-HAR, FedReptile and FedMAT share: the pairwise similarity loss, the Reptile server
step, and per-client heads over the client's own classes.

* Pairwise loss (Meta-HAR Eq. 4-5; Chain123/Meta-HAR): a shuffled batch of 2P windows is split into
  halves and window h is paired with window h + P; ``Phi = gamma * cos(e_h, e_{h+P})`` and the
  loss is binary cross-entropy with logits of Phi against "same activity" (the code's
  ``softplus(Phi) - y * Phi``), averaged over the P pairs. gamma = 10 (the code's ``Expand``).
* Reptile step (Nichol et al. 2018; Meta-HAR Sec. 4.2; Chain123/Meta-HAR met-har.py): ``theta <- theta + sigma *
  (mean_u theta_u - theta)`` over every array the clients return (batch-norm statistics
  included, as the code); the mean is unweighted (the code) or weighted by train windows, and
  with sigma = 1 and weighted means it is FedAvg's aggregation.
* Per-client heads: ``Linear(embedding, C_u)`` over the client's own classes (its train labels,
  ``Task.client_classes``), kept in the client state under ``user_head.`` with the class list;
  evaluation maps their logits back to the global labels (``Predictor.classes``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedwear.evaluation.predictor import Predictor, digest
from fedwear.methods.api import Record
from fedwear.methods.fedavg import FedAvg
from fedwear.methods.training import host

USER = "user_head."
CLASSES = "user_head.classes"


def pairwise_loss(e: torch.Tensor, y: torch.Tensor, scale: float = 10.0) -> torch.Tensor:
    """Mean BCE-with-logits of ``scale * cos(e_h, e_{h+P})`` against ``y_h == y_{h+P}`` over the P
    pairs of a batch of 2P (an odd last window is left out; a batch of one gives 0)."""
    half = len(e) // 2
    if half == 0:
        return e.sum() * 0.0
    logits = scale * F.cosine_similarity(e[:half], e[half : 2 * half], dim=1)
    same = (y[:half] == y[half : 2 * half]).to(logits.dtype)
    return F.binary_cross_entropy_with_logits(logits, same)


def reptile_step(server: Record, replies: list[Record], sigma: float, weighted: bool = False) -> dict[str, np.ndarray]:
    """``theta + sigma * (mean_u theta_u - theta)`` for every array of the replies (float64 sums,
    the server's dtypes; integer arrays such as batch-norm counters take the rounded result)."""
    w = np.array([float(r.scalars["num_examples"]) if weighted else 1.0 for r in replies])
    w = w / w.sum()
    out = {}
    for k in replies[0].arrays:
        mean = sum(wi * r.arrays[k].astype(np.float64) for wi, r in zip(w, replies, strict=True))
        old = server.arrays[k].astype(np.float64) if k in server.arrays else mean
        new = old + sigma * (mean - old)
        dtype = replies[0].arrays[k].dtype
        out[k] = np.asarray(np.rint(new) if dtype.kind in "iu" else new, dtype=dtype)
    return out


class Reptile(FedAvg):
    """FedAvg whose server takes a Reptile step (:func:`reptile_step`) towards the replies,
    taken in client order; the options give ``sigma`` and ``weighted``."""

    mean_aggregation = False
    mean_step = True  # sigma <= 1 (Options)

    def aggregate(self, server, replies, round, plan=None):
        if not replies:
            return server
        reps = [replies[c] for c in sorted(replies)]
        return Record({**server.arrays, **reptile_step(server, reps, self.options.sigma, self.options.weighted)},
                      dict(server.scalars))


def own_classes(classes: dict[str, tuple[int, ...]], client: str, y: np.ndarray) -> tuple[int, ...]:
    """A client's own classes: from the task when known there, else its train labels."""
    return classes.get(client) or tuple(int(k) for k in np.unique(y))


def user_head(dim: int, classes: tuple[int, ...], arrays: dict[str, np.ndarray], seed: int,
              device: str = "cpu") -> nn.Linear:
    """The client's head over its own classes: its kept weights when they match ``classes``, else
    a new ``Linear(dim, C_u)`` initialised from ``seed``; built on the CPU (the same draws on
    every device), then moved to ``device``."""
    head = nn.Linear(dim, len(classes))
    kept = arrays.get(CLASSES)
    if kept is not None and tuple(int(k) for k in kept) == tuple(classes):
        with torch.no_grad():
            head.weight.copy_(torch.from_numpy(arrays[USER + "weight"]))
            head.bias.copy_(torch.from_numpy(arrays[USER + "bias"]))
    else:
        g = torch.Generator().manual_seed(seed)
        bound = 1.0 / dim**0.5  # torch's Linear default, drawn from a seeded generator
        with torch.no_grad():
            head.weight.uniform_(-bound, bound, generator=g)
            head.bias.uniform_(-bound, bound, generator=g)
    return head.to(device)


def head_arrays(head: nn.Linear, classes: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {USER + "weight": host(head.weight).copy(),
            USER + "bias": host(head.bias).copy(),
            CLASSES: np.asarray(classes, np.int64)}


def local_labels(y: torch.Tensor, classes: tuple[int, ...]) -> torch.Tensor:
    """Global labels -> indices into the client's own classes."""
    return torch.searchsorted(torch.tensor(classes, dtype=y.dtype, device=y.device), y)


def user_predictor(features, arrays: dict[str, np.ndarray], body_key: str | None, device: str = "cpu") -> Predictor:
    """The embedding ``features`` (on ``device``) with the client's head of ``arrays``, keyed by its weights."""
    classes = tuple(int(k) for k in arrays[CLASSES])
    head = user_head(arrays[USER + "weight"].shape[1], classes, arrays, 0, device).eval()
    key = digest((k, v) for k, v in sorted(arrays.items()) if k.startswith(USER))
    return Predictor(features, head, body_key, key, device, classes)


__all__ = ["CLASSES", "USER", "Reptile", "head_arrays", "local_labels", "own_classes", "pairwise_loss", "reptile_step",
           "user_head", "user_predictor"]
