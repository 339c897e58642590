"""Class prototypes shared by the prototype methods (FedProto, ProtoHAR).

A prototype of class j is a mean embedding of class-j samples (FedProto, Tan et al. AAAI 2022,
Eq. 3; ProtoHAR, Cheng et al. IEEE JBHI 2023, Eq. 4). On the wire a client's prototypes are one
``[Q, k]`` array plus ``[Q]`` class counts (0: the client has no such class); the server's are
``[Q, k]`` plus a ``[Q]`` mask of the classes some client returned this round.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
import torch.nn.functional as F

from fedwear.methods.api import Record

PROTO, COUNT, MASK = "proto", "proto_count", "proto_mask"


def class_means(z: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-class mean of embeddings ``z`` ``[N, k]`` (``[Q, k]``, zero rows for absent classes)
    and the class counts ``[Q]``."""
    z = z.detach().double()
    sums = torch.zeros(num_classes, z.shape[1], dtype=torch.float64).index_add_(0, y, z)
    counts = torch.bincount(y, minlength=num_classes).double()
    means = sums / counts.clamp(min=1).unsqueeze(1)
    return means.float().numpy(), counts.numpy().astype(np.float32)


def aggregate(replies: Iterable[Record], weighted: bool) -> tuple[np.ndarray, np.ndarray]:
    """Global prototypes ``[Q, k]`` and mask ``[Q]`` from this round's replies only.

    ``weighted``: class j's prototype is the count-weighted mean (ProtoHAR Eq. 8, without its
    stray 1/m); otherwise the plain mean over the clients that returned class j (FedProto's
    ``proto_aggregation``, also ProtoHAR's code, SPECS A4). A class no client returned is
    absent (mask 0), as both codes rebuild the prototypes from the round's clients.
    """
    replies = list(replies)
    protos = np.stack([r.arrays[PROTO].astype(np.float64) for r in replies])  # [m, Q, k]
    counts = np.stack([r.arrays[COUNT].astype(np.float64) for r in replies])  # [m, Q]
    w = counts if weighted else (counts > 0).astype(np.float64)
    total = w.sum(0)
    mean = np.einsum("mq,mqk->qk", w, protos) / np.maximum(total, 1e-12)[:, None]
    return mean.astype(np.float32), (total > 0).astype(np.float32)


def targets(z: torch.Tensor, y: torch.Tensor, global_protos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The regulariser's target per sample: the global prototype of its class, or its own
    (detached) embedding when the class has none, so such samples add zero but still count in
    the mean (both codes: ``proto_new = protos.data`` then overwrite known labels)."""
    has = mask[y].bool()
    return torch.where(has.unsqueeze(1), global_protos[y], z.detach())


def distance(z: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """The prototype regulariser L_R: ``l2`` = MSE over all B x k entries (``nn.MSELoss``, the
    codes' default), ``l1`` = mean absolute error, ``cosine`` = mean of 1 - cos over samples."""
    if kind == "l2":
        return F.mse_loss(z, target)
    if kind == "l1":
        return F.l1_loss(z, target)
    return (1 - F.cosine_similarity(z, target, dim=1)).mean()


__all__ = ["COUNT", "MASK", "PROTO", "aggregate", "class_means", "distance", "targets"]
