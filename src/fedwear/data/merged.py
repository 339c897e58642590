"""Several activity datasets merged into one federation (``dataset.name: merged``).

Meta-HAR's "merged" stress test (Li et al., WWW 2021, Sec. 4.1) federates HHAR and USC-HAD
together: each dataset keeps its users, its activities are renamed into one label space (5 of
its 7 activities shared) and each is resampled to its own rate (HHAR 25 Hz, USC-HAD 50 Hz) so
that windows of the same length in samples cover the same tensor. HHAR is not among our data;
the same construction works with USC-HAD and UCI HAPT (``docs/config.md``, ``dataset.sources``).

Per source (:class:`fedwear.data.config.SourceConfig`): its recordings are read by its own
loader module (:data:`LOADERS`), relabelled into the unified class list through
``classes`` (unmapped classes become UNLABELLED; recordings left without a label are dropped),
restricted to ``dataset.channels`` (default: the first source's channels, which every source
must have), resampled to ``rate_hz`` or ``dataset.rate_hz`` (required), their subjects
renamed ``<tag>-s01`` (:func:`fedwear.data.partition.source_subject`) and tagged
``meta["source"] = <tag>``. The unified class list holds the mapped names in order of first
appearance over the sources. The rest of the pipeline is the usual one: ``client_by: [subject]``
gives one client per (source, subject), ``[source]`` one per source, ``normalize_group:
[source]`` statistics per source; ``FederatedData.info["sources"]`` lists each source's clients.

Units are left as each dataset ships them (USC-HAD's gyroscope in deg/s, UCI HAPT's in rad/s):
per-client or per-source normalisation puts them on one scale.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np

from fedwear.data import synthetic, uci_hapt, usc_had
from fedwear.data.config import DatasetConfig, SourceConfig
from fedwear.data.partition import source_subject
from fedwear.data.preprocess import bundled_root, resample
from fedwear.data.types import UNLABELLED, RawDataset, Recording
from fedwear.errors import ConfigError, DataError, FedwearError

NAME = "merged"
TITLE = "merged datasets"
DESCRIPTION = "several activity datasets in one federation (dataset.sources), one class list"
GENERATED = True  # no files of its own; the cache key lists its sources' files (cache.py)
RATE_HZ = 50.0  # nominal: a merged dataset runs at dataset.rate_hz
CHANNELS = ["acc_x", "acc_y", "acc_z", "gyro_x", "gyro_y", "gyro_z"]  # USC-HAD's and UCI HAPT's
#: The unified classes of Meta-HAR's merged example on our data (USC-HAD + UCI HAPT); a run's
#: come from its dataset.sources.
CLASS_NAMES = ["Walking", "Upstairs", "Downstairs", "Running", "Sitting", "Standing", "Lying"]

#: ``fedwear data info merged``: a merged dataset's facts are its sources'.
CARD: dict[str, object] = {
    "subjects": "those of its sources, as <tag>-s01", "rates": "dataset.rate_hz (or a source's rate_hz)",
    "sensors": "its sources' common channels, in each source's units",
    "files": "none of its own: dataset.sources[].root", "licence": "its sources'",
    "citation": "the merged setting of Li, Niu, Jiang, Zuo, Yang, Meta-HAR: "
    "Federated Representation Learning for Human Activity Recognition, WWW 2021",
    "url": "https://doi.org/10.1145/3442381.3450006",
}

#: The dataset modules a source may name (classification loaders; a new one is added here).
#: Imported directly rather than through ``fedwear.data.DATASETS``, which lists this module.
LOADERS: dict[str, ModuleType] = {m.NAME: m for m in (synthetic, uci_hapt, usc_had)}


def data_files(root: Path) -> list[Path]:
    """No files of its own (see :func:`source_files`)."""
    return []


def _where(i: int, src: SourceConfig) -> str:
    return f"dataset.sources[{i}] ({src.label})"


def loader(i: int, src: SourceConfig) -> ModuleType:
    """The loader module of source ``i``; ConfigError naming the mergeable ones otherwise."""
    mod = LOADERS.get(src.name)
    if mod is None:
        raise ConfigError(
            f"dataset.sources[{i}].name: {src.name!r} cannot be merged; mergeable datasets: "
            f"{', '.join(LOADERS)}"
        )
    return mod


def source_root(i: int, src: SourceConfig, parent: str | None = None) -> Path | None:
    """The folder source ``i`` is read from: its ``root``, else ``<parent>/<its dataset name>``
    when ``parent`` (``dataset.root``: the folder holding the sources' folders) is set, else its
    bundled subset; None for a generated source; otherwise a one-line error naming the source."""
    mod = loader(i, src)
    if getattr(mod, "GENERATED", False):
        return None
    from_parent = src.root is None and parent is not None
    if from_parent:
        src = src.model_copy(update={"root": str(Path(parent).expanduser() / src.name)})
    if src.root is None:
        bundled = bundled_root(src.name)
        if bundled is None:
            raise ConfigError(
                f"{_where(i, src)}: root is not set and fedwear ships no {src.name} subset: set "
                f"dataset.root (--root of fedwear reproduce) to the folder holding a {src.name}/ folder, or "
                f"dataset.sources[{i}].root=/path/to/{src.name}"
            )
        return bundled
    root = Path(src.root).expanduser()
    if not root.is_dir():
        fix = (f"dataset.root (--root of fedwear reproduce) must be the folder holding a {src.name}/ folder, or "
               if from_parent else "")
        raise DataError(
            f"{_where(i, src)}: root {str(root)!r} does not exist or is not a folder: {fix}set "
            f"dataset.sources[{i}].root to the folder holding {getattr(mod, 'TITLE', src.name)}"
        )
    return root


def source_files(cfg: DatasetConfig) -> list[tuple[str, Path | None, list[Path]]]:
    """Per source: its tag, root and data files (for the cache key)."""
    out = []
    for i, src in enumerate(cfg.sources):
        root = source_root(i, src, cfg.root)
        out.append((src.label, root, [] if root is None else loader(i, src).data_files(root)))
    return out


def source_config(cfg: DatasetConfig, i: int) -> DatasetConfig:
    """The dataset config source ``i``'s loader reads (its name, root and synthetic settings)."""
    src = cfg.sources[i]
    root = source_root(i, src, cfg.root)
    return cfg.model_copy(update={
        "name": src.name, "root": None if root is None else str(root), "sources": [],
        "synthetic": src.synthetic or cfg.synthetic,
    })  # fmt: skip


def class_map(i: int, src: SourceConfig, names: list[str]) -> dict[int, str]:
    """Source class index -> unified class name from ``src.classes`` (keys: the loader's class
    names, exact or ignoring case, or 0-based indices); every class under its own name when
    ``classes`` is empty."""
    if not src.classes:
        return dict(enumerate(names))
    known = ", ".join(f"{k}={n}" for k, n in enumerate(names))
    out: dict[int, str] = {}
    for key, unified in src.classes.items():
        if isinstance(key, int):
            idx = key if 0 <= key < len(names) else None
        elif key in names:
            idx = names.index(key)
        else:
            folded = [k for k, n in enumerate(names) if n.lower() == key.lower()]
            idx = folded[0] if len(folded) == 1 else None
        if idx is None:
            raise ConfigError(
                f"dataset.sources[{i}].classes: {key!r} is not a class of {src.name} ({known})"
            )
        if idx in out:
            raise ConfigError(
                f"dataset.sources[{i}].classes: class {idx}={names[idx]} is mapped twice: keep one"
            )
        if not unified.strip():
            raise ConfigError(f"dataset.sources[{i}].classes: {key!r} maps to an empty name")
        out[idx] = unified
    return out


def _channel_index(i: int, src: SourceConfig, have: list[str], want: list[str]) -> list[int]:
    """Positions of ``want`` in a source's channels ``have``; ConfigError naming the source."""
    missing = [c for c in want if c not in have]
    if missing:
        raise ConfigError(
            f"{_where(i, src)} has no channel(s) {missing} (it has {', '.join(have)}): merge "
            "sources with the same channels, or keep common ones with dataset.channels"
        )
    return [have.index(c) for c in want]


def load(cfg: DatasetConfig) -> RawDataset:
    """The sources' recordings, relabelled, resampled and tagged (module docstring)."""
    if not cfg.sources:
        raise ConfigError(
            "dataset.sources is empty: list the datasets to merge, e.g. [{name: usc_had, root: "
            "..., classes: {...}}, {name: uci_hapt, ...}] (dataset.name=merged)"
        )
    if cfg.rate_hz is None:
        raise ConfigError(
            "dataset.rate_hz is required for dataset.name=merged (its sources come at their own "
            "rates): set dataset.rate_hz, e.g. 50"
        )
    classes: list[str] = []
    channels: list[str] | None = list(cfg.channels) if cfg.channels is not None else None
    recs: list[Recording] = []
    for i, src in enumerate(cfg.sources):
        mod = loader(i, src)
        try:
            raw = mod.load(source_config(cfg, i))
        except FedwearError as e:  # the loader speaks of dataset.root: name the source too
            raise type(e)(f"{_where(i, src)}: {e}") from None
        if not raw.recordings:
            raise DataError(f"{_where(i, src)} has no recordings: check its root")
        mapping = class_map(i, src, raw.class_names)
        classes += [n for n in dict.fromkeys(mapping.values()) if n not in classes]
        lut = np.full(len(raw.class_names) + 1, UNLABELLED, np.int64)  # last slot: UNLABELLED
        for k, name in mapping.items():
            lut[k] = classes.index(name)
        if channels is None:
            channels = list(raw.recordings[0].channels)
        rate = src.rate_hz or cfg.rate_hz
        for r in raw.recordings:
            labels = lut[r.labels]
            if not (labels != UNLABELLED).any():
                continue
            cidx = _channel_index(i, src, r.channels, channels)
            sig = r.signal if cidx == list(range(len(r.channels))) else r.signal[:, cidx]
            meta = {**r.meta, "source": src.label}
            subject = source_subject(src.label, r.subject)
            rec = Recording(subject, r.session, sig, labels, list(channels), r.rate_hz, meta)
            recs.append(resample(rec, rate))
    return RawDataset(NAME, recs, classes)
