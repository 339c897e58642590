"""TS2Vec's contextual-consistency losses and crops, as PCFedH's module 1 uses them
(pcfedh/pcfedh; after yuezhihan/ts2vec ``ts2vec.py``).

Two views of a batch, ``z1`` and ``z2`` (``[B, T, D]``, the encoder's outputs on two
overlapping crops, aligned on their common steps), are pulled together:

- instance loss: at each step t, each of the 2B representations must pick its counterpart in
  the other view among the other 2B - 1 (InfoNCE on raw dot products, no temperature);
- temporal loss: in each sample, each of the 2T representations must pick the same step of the
  other view among the other 2T - 1;
- hierarchical: ``alpha * instance + (1 - alpha) * temporal`` at every level of max-pooling time
  by 2 until one step is left (instance only at that last level), averaged over the levels
  (TS2Vec, Yue et al., AAAI 2022, Section 3.2; PCFedH's code: ``alpha = 0.5``,
  ``temporal_unit = 0``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedwear.methods.host_sync import host_side


def _pick_counterpart(sim: torch.Tensor, n: int) -> torch.Tensor:
    """Mean cross-entropy over ``[..., 2n, 2n]`` similarities where row i's target is column
    ``i + n`` (first half) or ``i - n`` (second half) and the diagonal is left out.

    ``sim`` must be a fresh product (its diagonal is overwritten with -inf in place, which the
    product's backward does not need): no mask or copy of the ``[.., 2n, 2n]`` matrix is made."""
    size = sim.shape[-1]
    sim.diagonal(dim1=-2, dim2=-1).fill_(float("-inf"))
    idx = torch.arange(size, device=sim.device)
    target = torch.where(idx < n, idx + n, idx - n)
    return F.cross_entropy(sim.reshape(-1, size), target.repeat(sim.numel() // (size * size)))


def instance_contrastive_loss(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    b = z1.shape[0]
    if b == 1:
        return z1.new_zeros(())
    z = torch.cat([z1, z2], dim=0).transpose(0, 1)  # [T, 2B, D]
    return _pick_counterpart(z @ z.transpose(1, 2), b)


def temporal_contrastive_loss(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    t = z1.shape[1]
    if t == 1:
        return z1.new_zeros(())
    z = torch.cat([z1, z2], dim=1)  # [B, 2T, D]
    return _pick_counterpart(z @ z.transpose(1, 2), t)


def hierarchical_contrastive_loss(z1: torch.Tensor, z2: torch.Tensor, alpha: float = 0.5,
                                  temporal_unit: int = 0) -> torch.Tensor:
    """The levels' losses averaged (see the module docstring); ``temporal_unit``: the first level
    with a temporal term."""
    total, levels = z1.new_zeros(()), 0
    while z1.shape[1] > 1:
        if alpha:
            total = total + alpha * instance_contrastive_loss(z1, z2)
        if levels >= temporal_unit and alpha != 1:
            total = total + (1 - alpha) * temporal_contrastive_loss(z1, z2)
        levels += 1
        z1 = F.max_pool1d(z1.transpose(1, 2), 2).transpose(1, 2)
        z2 = F.max_pool1d(z2.transpose(1, 2), 2).transpose(1, 2)
    if alpha:
        total = total + alpha * instance_contrastive_loss(z1, z2)
    return total / (levels + 1)


def overlapping_crops(length: int, batch: int, min_crop: int, generator: torch.Generator
                      ) -> tuple[int, int, int, int, torch.Tensor]:
    """TS2Vec's random cropping, as pcfedh/pcfedh runs it: a common segment ``[left, right)`` of
    ``crop ~ U{min_crop..length}`` steps, view 1 ``[eleft, right)`` and view 2
    ``[left, eright)`` around it, and a per-sample shift that keeps both views inside the series.
    Returns ``(eleft, left, right, eright, offsets)``; PCFedH's code: ``min_crop = length - 20``.
    """
    def draw(low: int, high: int, size: int = 1) -> torch.Tensor:  # integers in [low, high]
        return torch.randint(low, high + 1, (size,), generator=generator)

    with host_side():  # the draws are host tensors: reading them waits for no device
        crop = int(draw(min_crop, length))
        left = int(draw(0, length - crop))
        right = left + crop
        eleft = int(draw(0, left))
        eright = int(draw(right, length))
        offsets = draw(-eleft, length - eright, batch)
    return eleft, left, right, eright, offsets


def take_windows(x: torch.Tensor, start: torch.Tensor, length: int) -> torch.Tensor:
    """``x[i, start[i] : start[i] + length]`` for every sample (``[B, T, C] -> [B, length, C]``);
    ``start`` may be on the host (the crops' draws): the index is made there and copied to ``x``'s
    device without waiting for its queued work."""
    idx = (start.unsqueeze(1) + torch.arange(length, device=start.device).unsqueeze(0)).to(x.device, non_blocking=True)
    return x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
