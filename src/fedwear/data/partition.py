"""From one pool of windows to federated clients.

Order (fixed): partition -> label skew -> per-client split -> ``min_windows`` ->
``max_clients`` -> ``held_out`` -> normalisation.

* ``natural``: one client per subject (the usual HAR FL setting, e.g. ProtoHAR, SPECS A2).
* ``dirichlet``: per class, windows are shared over ``num_clients`` clients with
  Dirichlet(alpha) proportions (Hsu, Qi and Brown, "Measuring the effects of non-identical data
  distribution for federated visual classification", 2019), in groups of overlapping windows so
  that no two clients hold overlapping windows. Windows keep their recording/start, so the later
  per-client split is still leak-free.
* ``drop_classes``: label skew, each client loses ``k`` of its classes at random, keeping at
  least one; labels are not remapped (ProtoHAR's ``stdv``, SPECS A2 step 1).
"""

from __future__ import annotations

import zlib

import numpy as np

from fedwear.data.config import DatasetConfig
from fedwear.data.preprocess import apply_stats, channel_stats
from fedwear.data.split import split_indices
from fedwear.data.types import ClientData, Recording, Windows
from fedwear.errors import ConfigError, DataError

Part = list[tuple[str, np.ndarray]]  # (client id, window indices)

# stream ids keep the random draws of each stage independent of the others
_DIRICHLET, _DROP, _SPLIT, _HELD_OUT = 1, 2, 3, 4


def rng_for(seed: int, *keys: int) -> np.random.Generator:
    """A numpy Generator for one stage (and client) derived from the run seed."""
    return np.random.default_rng(np.random.SeedSequence([seed % 2**63, *keys]))


def _stable(client: str) -> int:
    return zlib.crc32(client.encode())


def client_id(subject: str) -> str:
    """``"s01"``-style id: zero-padded when the subject id is a number."""
    return f"s{int(subject):02d}" if subject.isdigit() else f"s{subject}"


def natural(w: Windows, recordings: list[Recording]) -> Part:
    """One client per subject, ordered numerically by subject id."""
    subj = np.array([r.subject for r in recordings], dtype=object)
    names = sorted(set(subj), key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0, s))
    by_rec = {s: np.flatnonzero(subj == s) for s in names}
    return [(client_id(s), np.flatnonzero(np.isin(w.recording, by_rec[s]))) for s in names]


def overlap_groups(w: Windows, window: int) -> np.ndarray:
    """Group id per window: windows of one recording that overlap (directly or through a chain
    of overlapping windows) share a group. With ``stride >= window`` every window is its own."""
    order = np.lexsort((w.start, w.recording))
    rec, start = w.recording[order], w.start[order]
    new = np.ones(len(order), bool)
    new[1:] = (rec[1:] != rec[:-1]) | (start[1:] >= start[:-1] + window)
    groups = np.empty(len(order), np.int64)
    groups[order] = np.cumsum(new) - 1
    return groups


def dirichlet(w: Windows, num_clients: int, alpha: float, rng: np.random.Generator, window: int) -> Part:
    """Per class, groups of overlapping windows (:func:`overlap_groups`) go to ``num_clients``
    clients in Dirichlet(alpha) proportions of their window counts. A group never straddles two
    clients, so no window of one client overlaps a window of another (no leakage across clients
    when ``stride < window``); every window is assigned exactly once."""
    groups = overlap_groups(w, window)
    owner = np.empty(len(w), np.int64)
    for c in np.unique(w.y):
        ids, sizes = np.unique(groups[w.y == c], return_counts=True)
        perm = rng.permutation(len(ids))
        props = rng.dirichlet(np.full(num_clients, alpha))
        mid = (np.cumsum(sizes[perm]) - sizes[perm] / 2) / sizes.sum()  # each group's centre
        client = np.minimum(np.searchsorted(np.cumsum(props), mid, side="right"), num_clients - 1)
        owner_of_group = dict(zip(ids[perm].tolist(), client.tolist(), strict=True))
        members = np.flatnonzero(w.y == c)
        owner[members] = [owner_of_group[g] for g in groups[members].tolist()]
    width = max(2, len(str(num_clients - 1)))
    return [(f"c{k:0{width}d}", np.flatnonzero(owner == k)) for k in range(num_clients)]


def drop_classes(y: np.ndarray, idx: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``idx`` without ``min(k, n_classes - 1)`` of its classes, chosen at random."""
    have = np.unique(y[idx])
    n_drop = min(k, len(have) - 1)
    if n_drop <= 0:
        return idx
    gone = rng.choice(have, n_drop, replace=False)
    return idx[~np.isin(y[idx], gone)]


def held_out_ids(ids: list[str], spec: int | list[str], seed: int) -> list[str]:
    """The clients that never train: ``spec`` of them drawn with the seed, or the listed ids."""
    if isinstance(spec, int):
        if spec < 0 or spec >= len(ids):
            raise ConfigError(
                f"dataset.held_out={spec} must be in 0..{len(ids) - 1} ({len(ids)} clients remain "
                "after filtering): lower it"
            )
        chosen = rng_for(seed, _HELD_OUT).choice(len(ids), spec, replace=False)
        return [ids[i] for i in sorted(chosen)]
    unknown = [c for c in spec if c not in ids]
    if unknown:
        raise ConfigError(
            f"dataset.held_out: unknown client id(s) {unknown}; valid: {', '.join(ids)}"
        )
    if len(set(spec)) >= len(ids):
        raise ConfigError("dataset.held_out lists every client: leave at least one to train")
    return [c for c in ids if c in set(spec)]


def _normalise(clients: list[ClientData], new: list[ClientData], mode: str) -> dict[str, object]:
    """Z-score in place with training-split statistics only (see DatasetConfig.normalize)."""
    if mode == "none":
        return {"mode": mode}

    def apply(c: ClientData, mean: np.ndarray, std: np.ndarray) -> None:
        c.train, c.val, c.test = (apply_stats(s, mean, std) for s in (c.train, c.val, c.test))

    if mode == "global":
        mean, std = channel_stats([c.train.x for c in clients])
        for c in clients + new:
            apply(c, mean, std)
        return {"mode": mode, "mean": mean.tolist(), "std": std.tolist()}
    for c in clients + new:
        apply(c, *channel_stats([c.train.x]))
    return {"mode": mode}


def assemble(
    w: Windows, recordings: list[Recording], cfg: DatasetConfig, seed: int
) -> tuple[list[ClientData], list[ClientData], dict[str, object]]:
    """Clients, new (held-out) clients and an info dict from all windows of a dataset."""
    if cfg.partition == "natural":
        part = natural(w, recordings)
    else:
        n = cfg.num_clients or len({r.subject for r in recordings})
        if n < 2:
            raise ConfigError("dataset.num_clients: dirichlet needs at least 2 clients; set it")
        part = dirichlet(w, n, cfg.dirichlet_alpha, rng_for(seed, _DIRICHLET), cfg.window)
    if cfg.drop_classes:
        k = cfg.drop_classes
        part = [(c, drop_classes(w.y, i, k, rng_for(seed, _DROP, _stable(c)))) for c, i in part]

    clients, dropped, counts = [], [], {"purged": 0}
    for cid, idx in part:
        sub = w.take(idx)
        tr, va, te = split_indices(sub, cfg, rng_for(seed, _SPLIT, _stable(cid)), counts)
        if len(tr) < cfg.min_windows:
            dropped.append(cid)
            continue
        clients.append(ClientData(cid, sub.take(tr), sub.take(te), sub.take(va)))
    if not clients:
        raise DataError(
            f"no client has >= {cfg.min_windows} training windows after the split: lower "
            "dataset.min_windows or dataset.window, or keep more classes/data"
        )
    if cfg.max_clients is not None:
        clients = clients[: cfg.max_clients]
    held = set(held_out_ids([c.client_id for c in clients], cfg.held_out, seed))
    new = [c for c in clients if c.client_id in held]
    clients = [c for c in clients if c.client_id not in held]
    norm = _normalise(clients, new, cfg.normalize)
    info: dict[str, object] = {
        "seed": seed,
        "dropped_clients": dropped,
        "purged_windows": counts["purged"],
        "held_out": [c.client_id for c in new],
        "normalize": norm,
    }
    return clients, new, info
