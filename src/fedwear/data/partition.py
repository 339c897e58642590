"""From one pool of windows to federated clients.

Order (fixed): partition -> label skew -> per-client split -> ``min_windows`` ->
``max_clients`` -> ``held_out`` -> normalisation.

* ``natural``: one client per distinct combination of the ``client_by`` recording keys; by
  default one per subject (the usual HAR FL setting, e.g. ProtoHAR's uschad_subdata.py), or e.g. per
  (user, phone model) on HHAR and per (subject, body position) on RealWorld (FedAli's Data_HHAR_FL.py, Data_RealWorld_FL.py).
* ``dirichlet``: per class, windows are shared over ``num_clients`` clients with
  Dirichlet(alpha) proportions (Hsu, Qi and Brown, "Measuring the effects of non-identical data
  distribution for federated visual classification", 2019), in groups of overlapping windows so
  that no two clients hold overlapping windows. Windows keep their recording/start, so the later
  per-client split is still leak-free.
* ``drop_classes``: label skew, each client loses ``k`` of its classes at random, keeping at
  least one; labels are not remapped (ProtoHAR's ``stdv``, cheng-haha/ProtoHAR ``data/DataSplitting.py``). With a range
  ``[lo, hi]`` each client draws its ``k`` uniformly in ``lo..hi`` (Meta-HAR: 0 to 2, its Sec. 4.1).
* A merged dataset's subjects carry their source's tag (``usc_had-s01``); that is their client
  id, with or without ``source`` in ``client_by``. ``info["client_meta"]`` / ``info["sources"]``
  give each client's source (:func:`client_info`).

Normalisation (``dataset.normalize``) z-scores every window with statistics of the training
clients' train splits only (``normalize_from: all_leaky`` widens that to every window, as FedAli's
code does): per client, pooled (``global``), or per group of recordings sharing the
``normalize_group`` keys with one scalar per sensor (``group``, FedAli's per-phone-model acc and
gyro statistics, getalp/FedAli Data_HHAR_FL.py). A window's group is its recording's, so a client whose recordings
span groups (e.g. one subject, four phones) is normalised window by window.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet

import numpy as np

from fedwear.data.config import DatasetConfig
from fedwear.data.preprocess import apply_stats, channel_stats, sensor_of, sensor_stats
from fedwear.data.split import split_indices
from fedwear.data.types import ClientData, Recording, Windows, key_value, recording_keys
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


def check_keys(recordings: list[Recording], keys: Sequence[str], setting: str) -> None:
    """ConfigError naming ``setting`` when one of ``keys`` is carried by no recording."""
    available = recording_keys(recordings)
    for k in keys:
        if k not in available:
            raise ConfigError(
                f"{setting}: no recording of this dataset carries the key {k!r}; "
                f"available: {', '.join(available)}"
            )


def _order(value: str | None) -> tuple[int, bool, int, str]:
    """Sort key of one value: absent first, then numbers numerically, then text."""
    if value is None:
        return (0, False, 0, "")
    return (1, not value.isdigit(), int(value) if value.isdigit() else 0, value)


def combinations(
    recordings: list[Recording], keys: Sequence[str]
) -> tuple[list[tuple[str | None, ...]], np.ndarray]:
    """The distinct combinations of the recordings' values of ``keys`` (None where one lacks a
    key), ordered by the values (:func:`_order`), and each recording's index into them."""
    vals = [tuple(key_value(r, k) for k in keys) for r in recordings]
    combos = sorted(set(vals), key=lambda t: tuple(_order(v) for v in t))
    index = {t: k for k, t in enumerate(combos)}
    return combos, np.array([index[t] for t in vals], np.int64)


def source_subject(source: str, subject: str) -> str:
    """The subject id of ``subject`` of a merged dataset's source ``source``: ``usc_had-s01``
    (:func:`client_id` behind the source's tag). Its client id under ``client_by: [subject]``
    is this string itself (:func:`natural`)."""
    return f"{source}-{client_id(subject)}"


def source_of(name: str, sources: Iterable[str]) -> str | None:
    """The source whose tag prefixes a merged dataset's subject or client id ``name``
    (:func:`source_subject`; a client of ``client_by: [source]`` is the tag itself), or None."""
    return next((s for s in sources if name == s or name.startswith(f"{s}-")), None)


def _name(
    values: tuple[str | None, ...], keys: Sequence[str], sources: AbstractSet[str] = frozenset()
) -> str:
    """Client id of one combination: its present values joined with '-', subject as s01.

    A subject already tagged with its source (a merged dataset's ``usc_had-s01``, one of
    ``sources``) is kept as it is, and a ``source`` value it already carries is not repeated,
    so ``client_by: [subject]`` and ``[source, subject]`` both give ``usc_had-s01``."""
    subject = dict(zip(keys, values, strict=True)).get("subject")
    tag = source_of(subject, sources) if subject is not None and sources else None
    parts = []
    for k, v in zip(keys, values, strict=True):
        if v is None or (k == "source" and tag is not None and v == tag):
            continue
        parts.append((v if tag is not None else client_id(v)) if k == "subject" else v)
    return "-".join(parts)


def natural(w: Windows, recordings: list[Recording], by: Sequence[str] = ("subject",)) -> Part:
    """One client per distinct combination of the recording keys ``by`` (``dataset.client_by``),
    ordered by the values (numbers numerically). With ``by = [subject]``, one client per subject
    (``s01``); with ``[subject, device]``, one per (subject, device) (``s01-nexus4``)."""
    check_keys(recordings, by, "dataset.client_by")
    combos, group_of = combinations(recordings, by)
    sources = {r.meta["source"] for r in recordings if "source" in r.meta}
    names = [_name(t, by, sources) for t in combos]
    if "" in names:
        r = recordings[int(np.flatnonzero(group_of == names.index(""))[0])]
        raise DataError(
            f"recording {r.session} of subject {r.subject} carries "
            f"none of dataset.client_by={list(by)}: add 'subject' to dataset.client_by"
        )
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise DataError(
            f"dataset.client_by={list(by)} gives two clients the id {dup!r} (values containing "
            "'-' or a value missing from some recordings): choose other dataset.client_by keys"
        )
    owner = group_of[w.recording] if len(recordings) else np.zeros(0, np.int64)
    return [(n, np.flatnonzero(owner == k)) for k, n in enumerate(names)]


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


def drop_classes(
    y: np.ndarray, idx: np.ndarray, k: int | Sequence[int], rng: np.random.Generator
) -> np.ndarray:
    """``idx`` without ``min(k, n_classes - 1)`` of its classes, chosen at random.

    ``k`` is a count (ProtoHAR's DataSplitting.py) or a range ``(lo, hi)``: the count is then drawn
    uniformly in ``lo..hi`` first, from the same generator (Meta-HAR removes 0 to 2 activities
    per user, Meta-HAR Sec. 4.1). A count's draws are those of the count alone."""
    have = np.unique(y[idx])
    if not isinstance(k, int | np.integer):
        lo, hi = k
        k = int(rng.integers(lo, hi + 1))
    n_drop = min(k, len(have) - 1)
    if n_drop <= 0:
        return idx
    gone = rng.choice(have, n_drop, replace=False)
    return idx[~np.isin(y[idx], gone)]


def split_off_new(clients: list[ClientData], cfg: DatasetConfig, seed: int,
                  recordings: list[Recording] | None = None) -> tuple[list[ClientData], list[ClientData]]:
    """(training clients, new clients): the first ``dataset.max_clients`` clients, of which the
    ``dataset.held_out`` ones never train (:func:`held_out_ids`), drawn within each value of the
    recordings' ``dataset.held_out_per`` meta key when it is set (Meta-HAR's merged set: one
    meta-test user from each source, Meta-HAR Sec. 4.2)."""
    if cfg.max_clients is not None:
        clients = clients[: cfg.max_clients]
    ids = [c.client_id for c in clients]
    if cfg.held_out_per is None:
        held = set(held_out_ids(ids, cfg.held_out, seed))
    else:
        groups = client_groups(clients, recordings or [], cfg.held_out_per)
        held = set()
        for value in sorted(set(groups.values())):
            members = [c for c in ids if groups[c] == value]
            held.update(held_out_ids(members, cfg.held_out, seed, _stable(value),
                                     where=f" among the {cfg.held_out_per}={value} clients"))
    return [c for c in clients if c.client_id not in held], [c for c in clients if c.client_id in held]


def client_groups(clients: list[ClientData], recordings: list[Recording], key: str) -> dict[str, str]:
    """Each client's value of the recordings' meta ``key``; a one-line error when a client's
    recordings have none or several (``dataset.held_out_per``)."""
    out = {}
    for c in clients:
        recs = np.unique(np.concatenate([c.train.recording, c.val.recording, c.test.recording]))
        values = {recordings[i].meta.get(key) for i in recs.tolist()} if recordings else {None}
        if len(values) != 1 or None in values:
            raise ConfigError(
                f"dataset.held_out_per={key}: client {c.client_id!r} has {'no' if None in values else 'several'} "
                f"{key} value(s) in its recordings; use a key each client has exactly one of (e.g. source on a "
                "merged dataset) or set held_out_per: null"
            )
        out[c.client_id] = values.pop()
    return out


def held_out_ids(ids: list[str], spec: int | list[str], seed: int, *salt: int, where: str = "") -> list[str]:
    """The clients that never train: ``spec`` of them drawn with the seed (and ``salt``, one
    draw per group), or the listed ids."""
    if isinstance(spec, int):
        if spec < 0 or spec >= len(ids):
            raise ConfigError(
                f"dataset.held_out={spec} must be in 0..{len(ids) - 1} ({len(ids)} clients remain "
                f"after filtering{where}): lower it"
            )
        chosen = rng_for(seed, _HELD_OUT, *salt).choice(len(ids), spec, replace=False)
        return [ids[i] for i in sorted(chosen)]
    unknown = [c for c in spec if c not in ids]
    if unknown:
        raise ConfigError(
            f"dataset.held_out: unknown client id(s) {unknown}; valid: {', '.join(ids)}"
        )
    if len(set(spec)) >= len(ids):
        raise ConfigError("dataset.held_out lists every client: leave at least one to train")
    return [c for c in ids if c in set(spec)]


def _splits(c: ClientData, leaky: bool) -> list[Windows]:
    """The windows of ``c`` statistics are taken from: train, or all three splits if ``leaky``."""
    return [c.train, c.val, c.test] if leaky else [c.train]


def _normalise(
    clients: list[ClientData], new: list[ClientData], cfg: DatasetConfig,
    recordings: list[Recording],
) -> dict[str, object]:
    """Z-score in place (see DatasetConfig.normalize and normalize_from)."""
    mode, leaky = cfg.normalize, cfg.normalize_from == "all_leaky"
    if mode == "none":
        return {"mode": mode}
    if mode == "group":
        return _normalise_groups(clients, new, cfg, recordings)
    pooled = None  # global: one mean/std from every training client (all_leaky: every client)
    if mode == "global":
        pool = clients + new if leaky else clients
        pooled = channel_stats([s.x for c in pool for s in _splits(c, leaky)])
    stats = {}  # what a deployed model's input must be scaled with (fedwear export)
    for c in clients + new:
        mean, std = pooled or channel_stats([s.x for s in _splits(c, leaky)])
        c.train, c.val, c.test = (apply_stats(s, mean, std) for s in (c.train, c.val, c.test))
        stats[c.client_id] = {"mean": np.asarray(mean).tolist(), "std": np.asarray(std).tolist()}
    if pooled is None:
        return {"mode": mode, "clients": stats}
    return {"mode": mode, "mean": pooled[0].tolist(), "std": pooled[1].tolist()}


def _normalise_groups(
    clients: list[ClientData], new: list[ClientData], cfg: DatasetConfig,
    recordings: list[Recording],
) -> dict[str, object]:
    """``normalize: group``: one mean/std per sensor per group of recordings sharing the values
    of ``cfg.normalize_group`` (FedAli: per phone model, acc and gyro scalars, Data_HHAR_FL.py), from
    the training clients' train windows of the group (every window of every client with
    ``all_leaky``). Each window is scaled with its own recording's group statistics."""
    keys = cfg.normalize_group
    check_keys(recordings, keys, "dataset.normalize_group")
    leaky = cfg.normalize_from == "all_leaky"
    combos, group_of = combinations(recordings, keys)  # group_of: recording -> group
    channels = recordings[0].channels
    pool = [s for c in (clients + new if leaky else clients) for s in _splits(c, leaky)]
    means, stds, found = {}, {}, {}
    for k in range(len(combos)):
        xs = [s.x[group_of[s.recording] == k] for s in pool]
        xs = [x for x in xs if len(x)]
        if xs:
            means[k], stds[k] = sensor_stats(xs, channels)
            found[k] = sum(len(x) for x in xs)

    def label(k: int) -> str:
        return ",".join(f"{key}={v}" for key, v in zip(keys, combos[k], strict=True)) or "all"

    nc = len(channels)
    mean = np.stack([means.get(k, np.zeros(nc, np.float32)) for k in range(len(combos))])
    std = np.stack([stds.get(k, np.ones(nc, np.float32)) for k in range(len(combos))])
    first: dict[str, int] = {}  # sensor -> its first channel
    for i, ch in enumerate(channels):
        first.setdefault(sensor_of(ch), i)

    def scale(w: Windows) -> Windows:
        g = group_of[w.recording]
        missing = sorted(set(np.unique(g).tolist()) - set(means))
        if missing:
            raise DataError(
                f"dataset.normalize=group: group {label(missing[0])} has no training windows to "
                "take statistics from (only val/test windows or held-out clients): change "
                "dataset.normalize_group or dataset.held_out"
            )
        x = ((w.x - mean[g][:, None, :]) / std[g][:, None, :]).astype(np.float32, copy=False)
        return Windows(x, w.y, w.recording, w.start)

    for c in clients + new:
        c.train, c.val, c.test = (scale(s) for s in (c.train, c.val, c.test))
    return {
        "mode": "group",
        "by": list(keys),
        "from": cfg.normalize_from,
        "groups": {
            label(k): {
                "windows": found[k],
                "mean": {s: float(means[k][i]) for s, i in first.items()},
                "std": {s: float(stds[k][i]) for s, i in first.items()},
            }
            for k in sorted(means)
        },
    }


def assemble(
    w: Windows, recordings: list[Recording], cfg: DatasetConfig, seed: int
) -> tuple[list[ClientData], list[ClientData], dict[str, object]]:
    """Clients, new (held-out) clients and an info dict from all windows of a dataset."""
    if cfg.partition == "natural":
        part = natural(w, recordings, cfg.client_by)
    else:
        n = cfg.num_clients or len({r.subject for r in recordings})
        if n < 2:
            raise ConfigError("dataset.num_clients: dirichlet needs at least 2 clients; set it")
        part = dirichlet(w, n, cfg.dirichlet_alpha, rng_for(seed, _DIRICHLET), cfg.window)
    if cfg.drop_classes:
        k = cfg.drop_classes if isinstance(cfg.drop_classes, int) else tuple(cfg.drop_classes)
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
    clients, new = split_off_new(clients, cfg, seed, recordings)
    norm = _normalise(clients, new, cfg, recordings)
    info: dict[str, object] = {
        "seed": seed,
        "dropped_clients": dropped,
        "purged_windows": counts["purged"],
        "held_out": [c.client_id for c in new],
        "normalize": norm,
    }
    info.update(client_info(clients, new, recordings, cfg))
    return clients, new, info


def client_info(
    clients: list[ClientData], new: list[ClientData], recordings: list[Recording],
    cfg: DatasetConfig,
) -> dict[str, object]:
    """What the recordings' metadata says about each client, for splitting results (e.g. by
    source, Meta-HAR's merged set, its Sec. 4.1): nothing when no recording carries metadata (so
    the info of such datasets is as before).

    ``client_meta``: per client (training and held-out), each meta key's value over the
    client's windows (a sorted list when they hold several). ``sources`` (merged datasets):
    per source tag, its dataset, rate and training / held-out client ids."""
    keys = sorted({k for r in recordings for k in r.meta})
    if not keys:
        return {}
    meta: dict[str, dict[str, str | list[str]]] = {}
    for c in clients + new:
        recs = np.unique(np.concatenate([c.train.recording, c.val.recording, c.test.recording]))
        row: dict[str, str | list[str]] = {}
        for k in keys:
            vals = sorted({v for i in recs.tolist() if (v := recordings[i].meta.get(k)) is not None})
            if vals:
                row[k] = vals[0] if len(vals) == 1 else vals
        meta[c.client_id] = row
    out: dict[str, object] = {"client_meta": meta}
    if cfg.sources:
        rates = {r.meta.get("source"): r.rate_hz for r in recordings}
        out["sources"] = {
            s.label: {
                "dataset": s.name,
                "rate_hz": rates.get(s.label),
                "clients": [c.client_id for c in clients if meta[c.client_id].get("source") == s.label],
                "held_out": [c.client_id for c in new if meta[c.client_id].get("source") == s.label],
            }
            for s in cfg.sources
        }
    return out
