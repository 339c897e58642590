"""fedwear's data layer: raw loaders, preprocessing, client partitions, splits and a disk cache.

Pipeline of :func:`load_federated`: load -> select/resample/window per recording -> partition
into clients -> label skew -> per-client split -> ``held_out`` -> normalise -> FederatedData.
A forecasting dataset (``KIND = "regression"``) goes load -> select/resample -> next-value
windows and a chronological split per series -> ``held_out`` -> scaling
(:func:`fedwear.data.forecast.forecast_clients`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import numpy as np

from fedwear.data import (
    cache,
    distracted_driving,
    extrasensory,
    harbox,
    hhar,
    merged,
    own,
    pamap2,
    ppg_dalia_hr,
    realworld,
    stress_predict_hr,
    synthetic,
    synthetic_hr,
    uci_hapt,
    unimib_shar,
    usc_had,
    wisdm,
)
from fedwear.data.config import DatasetConfig
from fedwear.data.forecast import forecast_clients
from fedwear.data.partition import assemble, natural
from fedwear.data.preprocess import bundled_root, preprocess, require_root, resample, select
from fedwear.data.types import UNLABELLED, ClientData, FederatedData, RawDataset, Windows
from fedwear.errors import ConfigError, DataError

__all__ = [
    "DATASETS", "card", "dataset_info", "dataset_label", "dataset_kind", "dataset_module", "dataset_status",
    "load_federated", "load_raw",
]  # fmt: skip

#: name -> loader module; each has NAME, DESCRIPTION, RATE_HZ, CHANNELS, CLASS_NAMES, KIND
#: (default classification), ``data_files(root) -> list[Path]`` and ``load(cfg) -> RawDataset``.
DATASETS: dict[str, ModuleType] = {
    m.NAME: m
    for m in (
        synthetic, uci_hapt, usc_had,
        pamap2, unimib_shar, harbox, hhar, realworld, extrasensory, wisdm, own,
        synthetic_hr, ppg_dalia_hr, distracted_driving, stress_predict_hr, merged,
    )
}  # fmt: skip

log = logging.getLogger("fedwear")

#: Cards of the datasets whose modules carry none (``fedwear data info``); a module's ``CARD``
#: wins. Keys: subjects, classes, rates, sensors, files, licence, citation, url.
CARDS: dict[str, dict[str, object]] = {
    "uci_hapt": {
        "subjects": 30, "rates": "50 Hz", "sensors": "Samsung Galaxy S II on the waist: acc (g), gyro (rad/s)",
        "files": "RawData/acc_expXX_userYY.txt, gyro_expXX_userYY.txt, labels.txt; activity_labels.txt",
        "licence": "CC BY 4.0 (UCI ML Repository)",
        "citation": "J.-L. Reyes-Ortiz, L. Oneto, A. Samà, X. Parra, D. Anguita, Transition-Aware "
        "Human Activity Recognition Using Smartphones, Neurocomputing 171 (2016) 754-767",
        "url": "https://archive.ics.uci.edu/dataset/341",
    },
    "usc_had": {
        "subjects": 14, "rates": "100 Hz", "sensors": "MotionNode IMU, front right hip: acc (g), gyro (dps)",
        "files": "Subject{1..14}/a{activity}t{trial}.mat",
        "licence": "not stated in the dataset's Readme.txt",
        "citation": "M. Zhang and A. A. Sawchuk, USC-HAD: A Daily Activity Dataset for Ubiquitous "
        "Activity Recognition Using Wearable Sensors, UbiComp SAGAware 2012",
        "url": "https://sipi.usc.edu/had/",
    },
    "ppg_dalia_hr": {
        "subjects": 15, "rates": "0.5 Hz (HR every 2 s)", "sensors": "chest-ECG heart rate (bpm)",
        "files": "S1.csv..S15.csv or S*/S*.pkl", "licence": "CC BY 4.0 (UCI ML Repository)",
        "citation": "A. Reiss, I. Indlekofer, P. Schmidt, K. Van Laerhoven, Deep PPG, Sensors 19(14), 2019",
        "url": "https://archive.ics.uci.edu/dataset/495/ppg+dalia",
    },
    "distracted_driving": {
        "subjects": 68, "rates": "1 Hz", "sensors": "heart rate (bpm) per drive",
        "files": "T001.csv..T088.csv", "licence": "see the paper's OSF project",
        "citation": "S. Taamneh et al., A multimodal dataset for various forms of distracted "
        "driving, Scientific Data 4:170110, 2017",
        "url": "https://osf.io/c42cn/",
    },
    "stress_predict_hr": {
        "subjects": 35, "rates": "1 Hz", "sensors": "Empatica E4 heart rate (bpm)",
        "files": "Raw_data/S01..S35/HR.csv", "licence": "MIT",
        "citation": "T. Iqbal et al., Stress Monitoring Using Wearable Sensors: A Pilot Study and "
        "Stress-Predict Dataset, Sensors 22(21):8135, 2022",
        "url": "https://github.com/italha-d/Stress-Predict-Dataset",
    },
}  # fmt: skip

#: Folder names ``fedwear data list --root DIR`` looks for under DIR besides the dataset's name.
FOLDERS: dict[str, tuple[str, ...]] = {
    "stress_predict_hr": ("stress_predict",),
    "hhar": ("Activity recognition exp",),
    "realworld": ("realworld2016_dataset",),
    "pamap2": ("PAMAP2_Dataset",),
    "unimib_shar": ("UniMiB-SHAR",),
    "harbox": ("large_scale_HARBox",),
    "wisdm_ar": ("wisdm", "WISDM_ar_v1.1"),
}


def dataset_kind(name: str) -> str:
    """``classification`` or ``regression`` (forecasting) for a dataset name."""
    return getattr(dataset_module(name), "KIND", "classification")


def dataset_module(name: str) -> ModuleType:
    """The loader module for ``name``; ConfigError listing the known names otherwise."""
    if name not in DATASETS:
        raise ConfigError(f"dataset.name: unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    return DATASETS[name]


def dataset_label(cfg: DatasetConfig) -> str:
    """The dataset's name as tables, reports and summary.json show it: with no ``dataset.root``, a
    dataset that ships a subset runs on that subset, and says so (``uci_hapt (bundled subset: 10
    of 30 users)``), so that its numbers are never taken for the full dataset's."""
    if cfg.root is None and bundled_root(cfg.name) is not None:
        subjects = getattr(DATASETS.get(cfg.name), "BUNDLED", "")
        return f"{cfg.name} (bundled subset{': ' + subjects if subjects else ''})"
    return cfg.name


def _files(cfg: DatasetConfig) -> tuple[list[Path], Path | None]:
    mod = dataset_module(cfg.name)
    if getattr(mod, "GENERATED", False):
        return [], None
    root = require_root(cfg, getattr(mod, "TITLE", None), getattr(mod, "BUNDLED", ""))
    if hasattr(mod, "files_for"):  # files that depend on the config (own data: the schema)
        return mod.files_for(cfg, root), root
    return mod.data_files(root), root


def load_raw(cfg: DatasetConfig) -> RawDataset:
    """The dataset's recordings as shipped (native rate, all channels and classes)."""
    return dataset_module(cfg.name).load(cfg)


def load_federated(cfg: DatasetConfig, seed: int) -> FederatedData:
    """Build (or read from ``cfg.cache_dir``) the federated dataset for ``cfg``.

    ``cfg.seed`` overrides ``seed`` when set; it drives every random choice (partition, label
    skew, splits, held-out clients) through numpy Generators."""
    seed = cfg.seed if cfg.seed is not None else seed
    files, root = _files(cfg)
    path = cache.cache_path(cfg, cache.cache_key(cfg, seed, files, root))
    hit = cache.load(path)
    if hit is not None:
        for message in hit.info.get("warnings", []):  # what building it warned about still holds
            log.warning("%s", message)
        return hit
    with _kept_warnings() as warned:
        data = _build(cfg, seed)
    data.info["warnings"] = warned
    cache.save(path, data)
    return data


@contextmanager
def _kept_warnings() -> Iterator[list[str]]:
    """The messages of the warnings fedwear logs meanwhile (kept with a cached dataset, so a
    run that reads it from the cache warns as the run that built it did)."""
    warned: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warned.append(record.getMessage())

    handler = Keep(logging.WARNING)
    log.addHandler(handler)
    try:
        yield warned
    finally:
        log.removeHandler(handler)


def _build(cfg: DatasetConfig, seed: int) -> FederatedData:
    raw = load_raw(cfg)
    native = raw.recordings[0].rate_hz if raw.recordings else None
    if dataset_kind(cfg.name) == "regression":
        return _forecasting(raw, cfg, seed, native)
    _check_rates(raw, cfg)
    proc, windows, rate = preprocess(raw, cfg)
    _warn_damage(proc, windows, cfg)
    clients, new, info = assemble(windows, proc.recordings, cfg, seed)
    _check_splits(proc.name, clients, new, info, cfg)
    info.update(
        native_rate_hz=native,
        stride=cfg.stride or cfg.window,
        class_ids=list(range(len(raw.class_names)) if cfg.classes is None else cfg.classes),
        recordings=[f"{r.subject}/{r.session}" for r in proc.recordings],
        num_windows=len(windows),
    )
    return FederatedData(
        name=cfg.name,
        clients=clients,
        new_clients=new,
        class_names=proc.class_names,
        channels=proc.recordings[0].channels,
        rate_hz=rate,
        window=cfg.window,
        info=info,
    )


def _check_rates(raw: RawDataset, cfg: DatasetConfig) -> None:
    """ConfigError when the recordings come at several rates and ``dataset.rate_hz`` is unset
    (HHAR: one rate per phone model), since windows would then cover different durations."""
    rates = sorted({r.rate_hz for r in raw.recordings})
    if cfg.rate_hz is None and len(rates) > 1 and not cfg.sources:
        raise ConfigError(
            f"dataset '{raw.name}' has recordings at {', '.join(f'{r:g}' for r in rates)} Hz: set "
            f"dataset.rate_hz (e.g. {rates[0]:g}) so that every window covers the same time"
        )


def _names(items: Sequence[str], limit: int = 10) -> str:
    """``a, b, c`` or ``a, b, ... (and N more)``."""
    head = ", ".join(items[:limit])
    return head + (f" (and {len(items) - limit} more)" if len(items) > limit else "")


def _warn_damage(proc: RawDataset, windows: Windows, cfg: DatasetConfig) -> None:
    """Warnings (``fedwear`` logger) naming the recordings too short for one window and, under
    the natural partition, the clients missing classes that other clients have. Nothing changes."""
    short = [
        f"subject {r.subject} {r.session} ({len(r.labels)} samples)"
        for r in proc.recordings
        if len(r.labels) < cfg.window
    ]
    if short:
        log.warning(
            "%s: %d recording(s) shorter than one window of %d samples give no window: %s",
            proc.name, len(short), cfg.window, _names(short),
        )
    y = windows.y
    if cfg.partition != "natural" or not len(y):
        return
    every = set(np.unique(y).tolist())
    lacking = []
    for cid, idx in natural(windows, proc.recordings, cfg.client_by):
        gone = sorted(every - set(np.unique(y[idx]).tolist()))
        if gone and len(idx):
            lacking.append(f"{cid} ({', '.join(proc.class_names[k] for k in gone)})")
    if lacking:
        log.warning(
            "%s: %d client(s) have no window of some classes that others have: %s",
            proc.name, len(lacking), _names(lacking),
        )


def _check_splits(
    name: str, clients: list[ClientData], new: list[ClientData], info: dict[str, object], cfg: DatasetConfig
) -> None:
    """Warnings naming the clients ``dataset.min_windows`` left out and the clients without test
    windows (every view leaves them out), and a DataError when no client has a test window: the
    run would evaluate nothing and print n/a everywhere, as if it had finished normally."""
    dropped = list(info["dropped_clients"])  # type: ignore[call-overload]
    if dropped:
        log.warning(
            "%s: %d client(s) have fewer than dataset.min_windows=%d train windows after the split "
            "and are left out: %s", name, len(dropped), cfg.min_windows, _names(dropped),
        )
    every = clients + new
    empty = [c.client_id for c in every if not len(c.test)]
    if not empty:
        return
    why = (
        "the time split tests on the last test_fraction of each class's windows, less those within "
        "one window of the last train window: record longer, lower dataset.window, raise "
        "dataset.test_fraction or set dataset.split=stratified"
        if cfg.split == "time"
        else "lower dataset.window, raise dataset.test_fraction, set dataset.stride to dataset.window "
        "(test windows overlapping a train window are purged) or give those clients more data"
    )
    what = (
        f"{name}: {len(empty)} of {len(every)} client(s) have no test windows after the {cfg.split} "
        f"split (test_fraction {cfg.test_fraction:g}, window {cfg.window}, stride {cfg.stride or cfg.window}): "
        f"{_names(empty)}"
    )
    if len(empty) == len(every):
        raise DataError(f"{what}; nothing could be evaluated: {why}")
    log.warning("%s; every view leaves them out: %s", what, why)


def _forecasting(raw: RawDataset, cfg: DatasetConfig, seed: int, native: float | None) -> FederatedData:
    if not raw.recordings:
        raise DataError(f"dataset '{raw.name}' has no recordings: check dataset.root")
    if cfg.client_by != ["subject"] or cfg.normalize == "group":
        raise ConfigError(
            "a forecasting dataset has one client per subject and scales all clients alike: "
            f"leave dataset.client_by at [subject] and set dataset.normalize to fixed, global or "
            f"none (got client_by={cfg.client_by}, normalize={cfg.normalize})"
        )
    proc = select(raw, cfg)
    if cfg.rate_hz is not None:
        proc = RawDataset(proc.name, [resample(r, cfg.rate_hz) for r in proc.recordings], [])
    clients, new, info, target = forecast_clients(proc.recordings, cfg, seed)
    info.update(
        native_rate_hz=native,
        stride=cfg.stride or 1,
        recordings=[f"{r.subject}/{r.session}" for r in proc.recordings],
        num_windows=sum(len(c.train) + len(c.val) + len(c.test) for c in clients + new),
    )
    return FederatedData(
        name=cfg.name, clients=clients, new_clients=new, class_names=[],
        channels=proc.recordings[0].channels, rate_hz=proc.recordings[0].rate_hz, window=cfg.window,
        info=info, kind="regression", target=target,
    )


def card(name: str) -> dict[str, object]:
    """The dataset's card: subjects, classes, rates, sensors, files, licence, citation, url (what
    is known without its files)."""
    mod = dataset_module(name)
    base: dict[str, object] = {"classes": list(mod.CLASS_NAMES), "rates": f"{mod.RATE_HZ:g} Hz"}
    return {**base, **CARDS.get(name, {}), **getattr(mod, "CARD", {})}


def dataset_status(name: str, root: Path) -> tuple[str, Path | None]:
    """What ``root`` holds of dataset ``name`` (``fedwear data list --root``): the folder found
    (``root/<name>`` or a usual folder name, :data:`FOLDERS`) and a short status. Nothing is read
    or hashed: files are listed and, where a download entry exists, counted against its layout."""
    from fedwear.data.download import all_sources, count_layout

    mod = dataset_module(name)
    if name == "merged":
        return "no files of its own: reads the datasets named in dataset.sources", None
    if getattr(mod, "GENERATED", False):
        return "generated, no files", None
    names = (name, *FOLDERS.get(name, ()))
    folder = next((root / n for n in names if (root / n).is_dir()), None)
    if folder is None:
        return f"not found (no {' or '.join(names)} folder)", None
    try:
        files = mod.data_files(folder)
    except OSError as exc:
        return f"unreadable ({exc.strerror})", folder
    if not files:
        return "empty: none of its files", folder
    src = all_sources().get(name)
    if src is None:
        return f"found: {len(files)} files", folder
    counts = count_layout(src, folder)
    short = [f"{n}/{e.count} {e.what}" for e, n in counts if e.count is not None and n < e.count]
    if short:
        return f"incomplete: {', '.join(short)}", folder
    return f"found: {len(files)} files, layout complete", folder


def dataset_info(name: str, root: str | Path | None, cfg: DatasetConfig | None = None) -> dict[str, object]:
    """Facts about a dataset on disk for ``fedwear data list/info``: description, card, native
    rate, channels, classes, and counts of files, subjects, recordings, samples and labelled
    samples per class. ``cfg`` supplies loader options (own data: ``schema_file``)."""
    mod = dataset_module(name)
    base = {} if cfg is None else cfg.model_dump(exclude={"name", "root", "cache_dir"})
    cfg = DatasetConfig(**{**base, "name": name, "root": None if root is None else str(root), "cache_dir": None})
    files, _ = _files(cfg)
    raw = mod.load(cfg)
    labels = np.concatenate([np.zeros(0, np.int64), *(r.labels for r in raw.recordings)])
    lab, n = np.unique(labels[labels != UNLABELLED], return_counts=True)
    counts = dict(zip(lab.tolist(), n.tolist(), strict=True))
    return {
        "name": name,
        "description": mod.DESCRIPTION,
        "rate_hz": raw.recordings[0].rate_hz if raw.recordings else mod.RATE_HZ,
        "channels": raw.recordings[0].channels if raw.recordings else list(mod.CHANNELS),
        "class_names": raw.class_names,
        "files": len(files),
        "subjects": len({r.subject for r in raw.recordings}),
        "recordings": len(raw.recordings),
        "samples": int(sum(len(r.labels) for r in raw.recordings)),
        "label_counts": {raw.class_names[k]: counts.get(k, 0) for k in range(len(raw.class_names))},
        "meta": {k: sorted({r.meta[k] for r in raw.recordings if k in r.meta})
                 for k in sorted({k for r in raw.recordings for k in r.meta})},
        "units": mod.units(cfg, Path(cfg.root)) if hasattr(mod, "units") and cfg.root else {},
        "card": card(name),
    }
