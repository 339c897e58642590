"""PCFedH's clustering steps: K-means from the global centres, densities, shares, aggregation,
ProtoNCE (invariants and hand-computed values)."""

import math

import numpy as np
import pytest
import torch

from fedwear.methods.clustering import (
    aggregate_prototypes,
    cluster_shares,
    concentration,
    local_kmeans_step,
    proto_nce_loss,
)


def test_one_kmeans_step_from_the_global_centres() -> None:
    x = np.array([[0.0, 0.0], [0.0, 1.0], [10.0, 10.0], [10.0, 12.0]])
    init = np.array([[1.0, 1.0], [9.0, 9.0]])
    centres, labels = local_kmeans_step(x, init, 2, seed=0)
    assert labels.tolist() == [0, 0, 1, 1]  # cluster ids stay aligned with the global ones
    assert np.allclose(centres, [[0.0, 0.5], [10.0, 11.0]])  # one update: the members' means


def test_concentration_by_hand() -> None:
    x = np.array([[0.0, 0.0], [0.0, 2.0], [5.0, 5.0], [9.0, 9.0]])
    centres = np.array([[0.0, 1.0], [5.0, 5.0], [9.0, 9.0]])
    labels = np.array([0, 0, 1, 2])
    phi = concentration(x, centres, labels)
    raw = 1.0 / math.log(2 + 10)  # cluster 0: mean distance 1; clusters 1, 2 (one point): the max
    assert np.allclose(phi, 0.2 * np.full(3, raw) / raw)
    assert phi.mean() == pytest.approx(0.2)


def test_shares_sum_to_one_per_cluster_and_fill_empty_counts() -> None:
    counts = np.array([[10, 0], [30, 40]])
    v = cluster_shares(counts)
    assert np.allclose(v.sum(axis=0), 1.0)
    assert v[0, 1] == pytest.approx(1e-4 * 10 / (1e-4 * 10 + 40))
    assert v[0, 0] == pytest.approx(0.25)


def test_aggregation_is_the_share_weighted_sum() -> None:
    local = np.array([[[1.0, 0.0], [0.0, 1.0]], [[3.0, 0.0], [0.0, 5.0]]])  # [N=2, K=2, D=2]
    shares = np.array([[0.25, 0.5], [0.75, 0.5]])
    assert np.allclose(aggregate_prototypes(shares, local), [[2.5, 0.0], [0.0, 3.0]])
    same = np.repeat(local[:1], 2, axis=0)  # equal client prototypes come back unchanged
    assert np.allclose(aggregate_prototypes(shares, same), local[0])


def test_proto_nce_by_hand() -> None:
    c = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    z = torch.tensor([[1.0, 0.1], [0.9, 0.2]])  # both choose prototype 0; 1 and 2 unused
    phi = torch.tensor([0.5, 0.25, 1.0])
    zn, cn = torch.nn.functional.normalize(z, dim=1), c
    ids = [0, 0, 1, 2]
    logits = torch.stack([torch.stack([zn[h] @ cn[i] / phi[i] for i in ids]) for h in range(2)])
    want = sum(-torch.log_softmax(logits[h], 0)[h] for h in range(2)) / 2
    assert float(proto_nce_loss(z, c, phi)) == pytest.approx(float(want), rel=1e-6)


def test_concentration_is_clipped_to_the_10th_90th_percentiles() -> None:
    # three clusters of two points at distance 1, 2, 3 from their centres
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [20.0, 0.0]])
    x = np.array([[0.0, 1.0], [0.0, -1.0], [10.0, 2.0], [10.0, -2.0], [20.0, 3.0], [20.0, -3.0]])
    phi = concentration(x, centres, np.array([0, 0, 1, 1, 2, 2]))
    assert np.allclose(phi, [0.12, 0.2, 0.28])  # [1, 2, 3] clipped to [1.2, 2.8], mean 0.2
