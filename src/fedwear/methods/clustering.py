"""Prototypical federated clustering: PCFedH module 1's client and server steps (Algorithm 1;
the code: pcfedh/pcfedh).

Client: one K-means step on the local features starting from the global prototypes
(:func:`local_kmeans_step`), the clusters' concentrations (:func:`concentration`, PCL's
density, Li et al., ICLR 2021, Eq. 12) and the ProtoNCE loss against the global prototypes
(:func:`proto_nce_loss`). Server: each client's share of each cluster (:func:`cluster_shares`,
PCFedH Eq. 9-10) and the share-weighted prototypes and concentrations
(:func:`aggregate_prototypes`; the code's rule: the paper's lines 7-8 take a plain mean).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

#: PCFedH's code replaces empty counts by this fraction of the client's windows.
EMPTY_SHARE = 1e-4


def local_kmeans_step(features: np.ndarray, init: np.ndarray | None, k: int, seed: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """One Lloyd step (scikit-learn ``KMeans(max_iter=1, n_init=1)``) from ``init`` (the global
    prototypes) or, without them, from ``k`` random points; returns the centres and each
    feature's nearest centre. PCFedH's code runs ``faiss.Kmeans(niter=1)`` the same way."""
    from sklearn.cluster import KMeans  # imported here: it slows every start-up

    km = KMeans(n_clusters=k, init=init if init is not None else "random", n_init=1, max_iter=1,
                random_state=seed, algorithm="lloyd")
    labels = km.fit_predict(np.asarray(features, np.float64))
    return km.cluster_centers_, labels


def concentration(features: np.ndarray, centres: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """PCL's density per cluster, as PCFedH's code (pcfedh/pcfedh) computes it:
    ``mean distance to the centre / log(n + 10)``; clusters with at most one point get the
    largest value; then clipped to the 10th-90th percentile and scaled to mean 0.2."""
    k = len(centres)
    phi = np.zeros(k)
    small = []
    for c in range(k):
        members = features[labels == c]
        if len(members) <= 1:
            small.append(c)
            continue
        phi[c] = np.linalg.norm(members - centres[c], axis=1).mean() / np.log(len(members) + 10)
    large = [c for c in range(k) if c not in small]
    phi[small] = phi[large].max() if large else 1.0
    phi = np.clip(phi, np.percentile(phi, 10), np.percentile(phi, 90))
    return 0.2 * phi / phi.mean()


def cluster_shares(counts: np.ndarray, sizes: np.ndarray | None = None) -> np.ndarray:
    """``V[i, k] = n_ik / sum_i n_ik`` (PCFedH Eq. 10) from ``counts[i, k]``, the windows of
    client i nearest to prototype k; an empty count counts as ``1e-4 * n_i`` (the code's), with
    ``n_i`` the client's windows (``sizes``; default: its counts' sum). Before any prototype
    exists every count is empty, so the shares are the clients' sizes' shares."""
    counts = np.asarray(counts, np.float64)
    n_i = (counts.sum(axis=1) if sizes is None else np.asarray(sizes, np.float64))[:, None]
    filled = np.where(counts == 0, EMPTY_SHARE * n_i, counts)
    return filled / filled.sum(axis=0, keepdims=True)


def aggregate_prototypes(shares: np.ndarray, local: np.ndarray) -> np.ndarray:
    """``c_k = sum_i V[i, k] * C_i[k]`` for ``local[i, k, ...]`` (prototypes ``[N, K, D]`` or
    concentrations ``[N, K]``); not re-normalised (clients normalise on use, as the code)."""
    return np.einsum("ik,ik...->k...", shares, np.asarray(local, np.float64))


def proto_nce_loss(z: torch.Tensor, prototypes: torch.Tensor, density: torch.Tensor) -> torch.Tensor:
    """ProtoNCE as PCFedH's code (pcfedh/pcfedh) applies it: each sample's positive is its most
    similar (cosine) prototype; the logits of row h are ``z_h . c / phi_c`` over the batch's
    positives (column h is row h's own) followed by every prototype no sample chose; the target
    of row h is column h. ``z`` and ``prototypes`` are L2-normalised here."""
    z = F.normalize(z, dim=-1)
    c = F.normalize(prototypes, dim=-1)
    positive = (z @ c.T).argmax(dim=1)
    chosen = torch.zeros(len(c), dtype=torch.bool, device=z.device)
    chosen[positive] = True
    ids = torch.cat([positive, torch.nonzero(~chosen).squeeze(1)])
    logits = z @ c[ids].T / density[ids]
    return F.cross_entropy(logits, torch.arange(len(z), device=z.device))
