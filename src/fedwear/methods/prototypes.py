"""Class prototypes shared by the prototype methods (FedProto, FedPCL, ProtoHAR).

A prototype of class j is a mean embedding of class-j samples (FedProto, Tan et al. AAAI 2022,
Eq. 3; ProtoHAR, Cheng et al. IEEE JBHI 2023, Eq. 4). On the wire a client's prototypes are one
``[Q, k]`` array plus ``[Q]`` class counts (0: the client has no such class); the server's are
``[Q, k]`` plus a ``[Q]`` mask of the classes some client returned this round.

For a regression task (heart-rate forecasting) the "classes" are *target bins*
(:func:`target_bins`, options :class:`TargetBinOptions`): fedwear's adaptation, since neither
FedProto nor FedPCL has one and PCFedH (Yin et al., FITEE 2025), which compares against both on
heart rate, does not say how its authors made them regress.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from fedwear.methods.api import Options, Record, Task
from fedwear.methods.training import host

PROTO, COUNT, MASK = "proto", "proto_count", "proto_mask"


def class_means(z: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-class mean of embeddings ``z`` ``[N, k]`` (``[Q, k]``, zero rows for absent classes)
    and the class counts ``[Q]``, on the host; computed on ``z``'s device."""
    z, y = z.detach().double(), y.to(z.device)
    sums = torch.zeros(num_classes, z.shape[1], dtype=torch.float64, device=z.device).index_add_(0, y, z)
    return means(sums, torch.bincount(y, minlength=num_classes).double())


def means(sums: torch.Tensor, counts: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per-class means ``[Q, k]`` (float32, zero rows for absent classes) and counts ``[Q]`` on the
    host, from float64 per-class sums of embeddings and the class counts."""
    return host((sums / counts.clamp(min=1).unsqueeze(1)).float()), host(counts).astype(np.float32)


def aggregate(replies: Iterable[Record], weighted: bool) -> tuple[np.ndarray, np.ndarray]:
    """Global prototypes ``[Q, k]`` and mask ``[Q]`` from this round's replies only.

    ``weighted``: class j's prototype is the count-weighted mean (ProtoHAR Eq. 8, without its
    stray 1/m); otherwise the plain mean over the clients that returned class j (FedProto's
    ``proto_aggregation``, also ProtoHAR's code, cheng-haha/ProtoHAR serverProtoHAR.py). A class no client returned is
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


#: Target values are rounded to this many decimals of their unit before binning, so that a
#: float32 target on an edge (70 bpm stored as 0.7 -> 69.99999881) lands in the bin it names.
BIN_DECIMALS = 4


class TargetBinOptions(Options):
    """Target bins, the pseudo-classes of a regression task (fedwear's choice, see the module)."""

    bin_low: float = Field(
        40.0, description="regression only: lower edge of the first target bin, in the target's "
        "units (bpm); fedwear's choice (the PCFedH paper gives none): 40 bpm is below resting "
        "heart rate in PPG-DaLiA and distracted driving (subject means 71-126 bpm)",
    )
    bin_width: float = Field(
        10.0, gt=0, description="regression only: width of every target bin in the target's units; "
        "fedwear's choice: 10 bpm; on the PCFedH configs' train windows a PPG-DaLiA client visits 8-12 "
        "bins (median about 100-180 windows per bin), a distracted-driving client 4-5",
    )
    bins: int = Field(
        16, ge=1, description="regression only: number of target bins (the pseudo-classes); "
        "fedwear's choice: 16 x 10 bpm covers 40-200 bpm, up to a maximal exercise heart rate; "
        "targets outside go to the first or last bin",
    )


def target_bins(y: torch.Tensor, target: tuple[float, float], low: float, width: float, bins: int
                ) -> torch.Tensor:
    """Bin ids ``[N]`` (int64) of scaled regression targets ``y``.

    A target's value in its own units is ``v = y * scale + shift`` (``target = (shift, scale)``,
    :class:`fedwear.data.types.FederatedData`), rounded to ``BIN_DECIMALS`` decimals; bin ``b``
    holds ``low + b * width <= v < low + (b + 1) * width``. Values below ``low`` go to bin 0,
    values at or above the last edge to bin ``bins - 1``.
    """
    shift, scale = target
    v = torch.round((y.detach().double() * scale + shift) * 10**BIN_DECIMALS) / 10**BIN_DECIMALS
    return torch.floor((v - low) / width).clamp(0, bins - 1).long()


def num_keys(task: Task, bins: TargetBinOptions) -> int:
    """Prototypes per client: one per class, or one per target bin for a regression task."""
    return bins.bins if task.kind == "regression" else task.num_classes


def keys(y: torch.Tensor, task: Task, bins: TargetBinOptions) -> torch.Tensor:
    """The prototype each sample belongs to: its class, or its target's bin (:func:`target_bins`)."""
    if task.kind == "regression":
        return target_bins(y, task.target, bins.bin_low, bins.bin_width, bins.bins)
    return y


__all__ = ["BIN_DECIMALS", "COUNT", "MASK", "PROTO", "TargetBinOptions", "aggregate", "class_means",
           "distance", "keys", "means", "num_keys", "target_bins", "targets"]
