"""PCFedH's encoder and TS2Vec's contextual-consistency losses, against explicit formulas."""

import math

import pytest
import torch

from fedwear.methods.contrastive import (
    hierarchical_contrastive_loss,
    instance_contrastive_loss,
    overlapping_crops,
    take_windows,
    temporal_contrastive_loss,
)
from fedwear.models.ts2vec import TSEncoder, instance_representation


def _infonce(reps: list[torch.Tensor], n: int) -> float:
    """Mean over the 2n representations of -log softmax(dot with the counterpart) among the
    other 2n - 1, written out."""
    total = 0.0
    for i in range(2 * n):
        j = i + n if i < n else i - n
        others = [k for k in range(2 * n) if k != i]
        logits = [float(reps[i] @ reps[k]) for k in others]
        m = max(logits)
        total += -(float(reps[i] @ reps[j]) - m - math.log(sum(math.exp(v - m) for v in logits)))
    return total / (2 * n)


def test_instance_and_temporal_losses_equal_the_formula() -> None:
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(3, 4, 5, generator=g, dtype=torch.float64), torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    inst = sum(_infonce([*z1[:, t], *z2[:, t]], 3) for t in range(4)) / 4
    temp = sum(_infonce([*z1[b], *z2[b]], 4) for b in range(3)) / 3
    assert float(instance_contrastive_loss(z1, z2)) == pytest.approx(inst, rel=1e-10)
    assert float(temporal_contrastive_loss(z1, z2)) == pytest.approx(temp, rel=1e-10)
    assert float(instance_contrastive_loss(z1[:1], z2[:1])) == 0.0


def test_hierarchical_loss_averages_the_levels() -> None:
    g = torch.Generator().manual_seed(1)
    z1, z2 = torch.randn(2, 4, 3, generator=g, dtype=torch.float64), torch.randn(2, 4, 3, generator=g, dtype=torch.float64)

    def pool(z):
        return torch.nn.functional.max_pool1d(z.transpose(1, 2), 2).transpose(1, 2)

    levels = [(z1, z2), (pool(z1), pool(z2))]
    want = sum(0.5 * instance_contrastive_loss(a, b) + 0.5 * temporal_contrastive_loss(a, b) for a, b in levels)
    last = pool(levels[-1][0]), pool(levels[-1][1])
    want = (want + 0.5 * instance_contrastive_loss(*last)) / 3  # T = 4, 2, 1
    assert float(hierarchical_contrastive_loss(z1, z2)) == pytest.approx(float(want), rel=1e-12)


def test_crops_share_their_common_segment() -> None:
    x = torch.arange(150, dtype=torch.float32).repeat(8, 1).unsqueeze(-1)  # value = time step
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        eleft, left, right, eright, off = overlapping_crops(150, 8, 130, g)
        assert 0 <= eleft <= left < right <= eright <= 150 and right - left >= 130
        v1 = take_windows(x, off + eleft, right - eleft)
        v2 = take_windows(x, off + left, eright - left)
        crop = right - left
        assert torch.equal(v1[:, -crop:], v2[:, :crop])  # the same steps in both views
        assert v1.min() >= 0 and v2.max() <= 149


def test_encoder_shapes_masks_and_features() -> None:
    torch.manual_seed(0)
    enc = TSEncoder()
    x = torch.randn(4, 150, 1)
    enc.eval()
    z = enc(x)
    assert z.shape == (4, 150, 10)
    assert torch.equal(z, enc(x))  # eval: no mask, no dropout
    enc.train()
    enc.dropout.p = 0.0
    assert torch.equal(enc(x, mask="all_true"), enc(x, mask="all_true"))
    assert not torch.equal(enc(x), enc(x))  # binomial timestamp masks differ
    assert torch.allclose(enc(x, mask="all_true"), z)
    rep = instance_representation(z)
    assert rep.shape == (4, 10) and torch.allclose(rep.norm(dim=1), torch.ones(4))
    # code default: two blocks (dilations 1, 2), hidden 16 -> output 10 with a projected residual
    assert [b.conv1.dilation[0] for b in enc.blocks] == [1, 2]
    assert enc.blocks[-1].residual is not None and enc.blocks[0].residual is None
