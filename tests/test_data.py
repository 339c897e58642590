"""Tests of the data layer: loaders on real slices, windowing, splits, partitions,
normalisation, determinism, cache and error messages."""

from __future__ import annotations

import gzip
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from fedwear.data import DATASETS, dataset_info, load_federated, load_raw, synthetic
from fedwear.data.config import DatasetConfig, SyntheticConfig
from fedwear.data.partition import dirichlet
from fedwear.data.preprocess import make_windows, window_starts
from fedwear.data.types import (
    UNLABELLED,
    ClientData,
    FederatedData,
    RawDataset,
    Recording,
    Windows,
)
from fedwear.errors import ConfigError, DataError

# ----------------------------------------------------------------------------- helpers


def syn(**kw: object) -> DatasetConfig:
    """A small synthetic config without caching."""
    s: dict[str, object] = {"seconds_per_class": 12.0}
    s.update(kw.pop("synthetic", {}))  # type: ignore[arg-type]
    base: dict[str, object] = {"name": "synthetic", "cache_dir": None, "window": 32}
    base.update(kw)
    return DatasetConfig(synthetic=SyntheticConfig(**s), **base)


def intervals_overlap(a: Windows, b: Windows, window: int) -> bool:
    """True if any window of ``a`` overlaps any window of ``b`` in the same recording."""
    for r in np.intersect1d(a.recording, b.recording):
        sa = a.start[a.recording == r]
        sb = b.start[b.recording == r]
        if np.any(np.abs(sa[:, None] - sb[None, :]) < window):
            return True
    return False


def all_clients(fd: FederatedData) -> list[ClientData]:
    return fd.clients + fd.new_clients


def usc_slice(data_root: Path, tmp_path: Path) -> Path:
    """Three USC-HAD files, one of them gzipped, plus the two label quirks."""
    src, dst = data_root / "usc_had", tmp_path / "usc"
    for rel in ["Subject1/a1t1.mat", "Subject1/a8t2.mat", "Subject14/a3t2.mat"]:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / rel, dst / rel)
    (dst / "Subject13").mkdir()
    with gzip.open(dst / "Subject13/a11t4.mat.gz", "wb") as fh:  # misspelt activity field
        fh.write((src / "Subject13/a11t4.mat").read_bytes())
    return dst


def hapt_slice(hapt_root: Path, tmp_path: Path) -> Path:
    """exp01 gzipped as shipped, exp02 decompressed, labels.txt filtered to them."""
    src, dst = hapt_root, tmp_path / "hapt"
    (dst / "RawData").mkdir(parents=True)
    for kind in ("acc", "gyro"):
        shutil.copy(src / f"RawData/{kind}_exp01_user01.txt.gz", dst / "RawData")
        with gzip.open(src / f"RawData/{kind}_exp02_user01.txt.gz", "rb") as fh:
            (dst / f"RawData/{kind}_exp02_user01.txt").write_bytes(fh.read())
    rows = [
        ln
        for ln in (src / "RawData/labels.txt").read_text().splitlines()
        if ln.split()[0] in ("1", "2")
    ]
    (dst / "RawData/labels.txt").write_text("\n".join(rows) + "\n")
    shutil.copy(src / "activity_labels.txt", dst)
    return dst


# ----------------------------------------------------------------------------- real loaders


def test_usc_had_slice(data_root: Path, tmp_path: Path) -> None:
    root = usc_slice(data_root, tmp_path)
    raw = load_raw(DatasetConfig(name="usc_had", root=str(root)))
    assert [(r.subject, r.session) for r in raw.recordings] == [
        ("1", "a1t1"), ("1", "a8t2"), ("13", "a11t4"), ("14", "a3t2"),
    ]  # fmt: skip
    assert len(raw.class_names) == 12 and raw.class_names[9] == "Sleeping"
    for r, lab in zip(raw.recordings, [0, 7, 10, 2], strict=True):  # label from the file name
        assert r.signal.dtype == np.float32 and r.signal.shape == (len(r.labels), 6)
        assert r.rate_hz == 100.0 and r.channels[3] == "gyro_x"
        assert set(np.unique(r.labels)) == {lab}
    info = dataset_info("usc_had", root)
    assert info["files"] == 4 and info["subjects"] == 3 and info["recordings"] == 4
    assert info["samples"] == sum(len(r.labels) for r in raw.recordings)

    fd = load_federated(
        DatasetConfig(name="usc_had", root=str(root), rate_hz=50, window=64, cache_dir=None), 0
    )
    assert fd.rate_hz == 50.0 and fd.window == 64
    assert [c.client_id for c in fd.clients] == ["s01", "s13", "s14"]
    assert all(c.train.x.shape[1:] == (64, 6) and c.train.x.dtype == np.float32 for c in fd.clients)


def test_uci_hapt_slice(hapt_root: Path, tmp_path: Path) -> None:
    root = hapt_slice(hapt_root, tmp_path)
    raw = load_raw(DatasetConfig(name="uci_hapt", root=str(root)))
    assert [(r.subject, r.session) for r in raw.recordings] == [("1", "exp01"), ("1", "exp02")]
    assert raw.class_names[0] == "WALKING" and raw.class_names[-1] == "LIE_TO_STAND"
    rows = np.loadtxt(root / "RawData/labels.txt", dtype=np.int64)
    for r, exp in zip(raw.recordings, (1, 2), strict=True):
        assert r.signal.shape[1] == 6 and r.rate_hz == 50.0 and r.signal.dtype == np.float32
        assert r.labels.min() >= UNLABELLED and r.labels.max() <= 11
        mine = rows[rows[:, 0] == exp]
        assert (r.labels != UNLABELLED).sum() == (mine[:, 4] - mine[:, 3] + 1).sum()
        first = mine[0]  # 1-based inclusive: sample start-1 is the first labelled one
        assert r.labels[first[3] - 2] == UNLABELLED and r.labels[first[3] - 1] == first[2] - 1
        assert r.labels[first[4] - 1] == first[2] - 1
    (root / "activity_labels.txt").unlink()  # falls back to the built-in names
    assert load_raw(DatasetConfig(name="uci_hapt", root=str(root))).class_names[5] == "LAYING"


@pytest.mark.slow
def test_full_datasets_counts(data_root: Path) -> None:
    usc = dataset_info("usc_had", data_root / "usc_had")
    assert usc["files"] == 840 and usc["subjects"] == 14 and usc["samples"] == 2_811_490
    hapt = dataset_info("uci_hapt", data_root / "uci_hapt")
    assert hapt["recordings"] == 61 and hapt["subjects"] == 30 and hapt["samples"] == 1_122_772


def test_registry() -> None:
    for name, mod in DATASETS.items():
        assert name == mod.NAME and mod.DESCRIPTION and mod.RATE_HZ > 0
        kind = getattr(mod, "KIND", "classification")
        assert mod.CHANNELS and bool(mod.CLASS_NAMES) == (kind == "classification")
    info = dataset_info("synthetic", None)
    assert info["subjects"] == 8 and info["files"] == 0


# ----------------------------------------------------------------------------- windowing


def test_windows_stay_inside_one_label() -> None:
    labels = np.array([0] * 10 + [UNLABELLED] * 3 + [1] * 7 + [2] * 4, np.int64)
    starts = window_starts(labels, 4, 2)
    for s in starts:
        seg = labels[s : s + 4]
        assert (seg == seg[0]).all() and seg[0] != UNLABELLED
    assert starts.tolist() == [0, 2, 4, 6, 13, 15, 20]
    sig = np.arange(len(labels) * 2, dtype=np.float32).reshape(-1, 2)
    recs = [Recording("1", "a", sig, labels, ["a", "b"], 10.0)] * 2
    w = make_windows(recs, 4, 2)
    assert w.x.shape == (14, 4, 2) and w.recording.tolist() == [0] * 7 + [1] * 7
    assert np.array_equal(w.x[4], sig[13:17]) and w.y[4] == 1


def test_resample_and_class_subset() -> None:
    fd = load_federated(syn(rate_hz=25.0, classes=[2, 0], normalize="none"), 0)
    assert fd.rate_hz == 25.0 and fd.class_names == ["class2", "class0"]
    assert fd.info["class_ids"] == [2, 0]
    assert set(np.concatenate([c.train.y for c in fd.clients])) == {0, 1}
    # 12 s at 25 Hz = 300 samples -> 9 windows of 32 per recording
    assert fd.info["num_windows"] == 8 * 2 * 9


# ----------------------------------------------------------------------------- splits


def test_trailing_windows_and_keeping_overlaps_as_protohars_code() -> None:
    """tail_window adds x[-window:] per labelled run; with purge off the overlapping test
    windows stay (ProtoHAR's code), with purge on they go."""
    labels = np.zeros(50, np.int64)
    assert window_starts(labels, 16, 16).tolist() == [0, 16, 32]
    assert window_starts(labels, 16, 16, tail=True).tolist() == [0, 16, 32, 34]
    assert window_starts(labels[:49], 16, 16, tail=True).tolist() == [0, 16, 32]  # ends at N-1: none
    kept = load_federated(syn(split="fewshot", shots=6, stride=32, tail_window=True, purge=False), 3)
    purged = load_federated(syn(split="fewshot", shots=6, stride=32, tail_window=True), 3)
    assert any(intervals_overlap(c.train, c.test, 32) for c in all_clients(kept))
    assert not any(intervals_overlap(c.train, c.test, 32) for c in all_clients(purged))
    assert purged.info["purged_windows"] > 0 and kept.info["purged_windows"] == 0


@pytest.mark.parametrize("split", ["time", "stratified", "fewshot"])
@pytest.mark.parametrize("partition", ["natural", "dirichlet"])
@pytest.mark.parametrize("stride", [32, 8])
def test_no_split_leakage(split: str, partition: str, stride: int) -> None:
    cfg = syn(split=split, partition=partition, stride=stride, val_fraction=0.2, shots=6)
    fd = load_federated(cfg, 3)
    assert fd.clients
    for c in all_clients(fd):
        assert not intervals_overlap(c.train, c.test, 32)
        assert not intervals_overlap(c.train, c.val, 32)
        assert not intervals_overlap(c.val, c.test, 32)
    # across the federation: no window of one client overlaps any window of another
    for a in all_clients(fd):
        for b in all_clients(fd):
            if a.client_id < b.client_id:
                for sa in (a.train, a.val, a.test):
                    for sb in (b.train, b.val, b.test):
                        assert not intervals_overlap(sa, sb, 32), (a.client_id, b.client_id)
    if split != "stratified" or stride == 32:
        assert all(len(c.test) > 0 for c in all_clients(fd))
    # the time split's gap makes purging a no-op; random splits of overlapping windows lose
    # the val/test windows next to train ones
    if split == "time" or stride == 32:
        assert fd.info["purged_windows"] == 0
    elif split == "stratified":
        assert fd.info["purged_windows"] > 0


def test_time_split_order_and_gap() -> None:
    fd = load_federated(syn(stride=16, val_fraction=0.25, normalize="none"), 0)
    for c in fd.clients:
        for k in np.unique(c.train.y):
            tr, va, te = (s.take(np.flatnonzero(s.y == k)) for s in (c.train, c.val, c.test))
            # one recording per (subject, class): order is by start; gap of a window each side
            if len(va):
                assert va.start.min() >= tr.start.max() + 2 * 32
            if len(te):
                before = va if len(va) else tr
                assert te.start.min() >= before.start.max() + 2 * 32


def test_fewshot_counts() -> None:
    cfg = syn(split="fewshot", synthetic={"seconds_per_class": 40.0}, normalize="none")
    fd = load_federated(cfg, 1)
    trs = []
    for c in fd.clients:
        for k in range(4):
            tr = int((c.train.y == k).sum())
            assert 18 <= tr <= 21
            assert (c.test.y == k).sum() == max(int(tr * 0.3 / 0.7), 1)
            trs.append(tr)
    assert len(set(trs)) > 1  # the cap is re-drawn


# ----------------------------------------------------------------------------- partitions


def test_dirichlet_assigns_each_window_once() -> None:
    y = np.repeat(np.arange(5), 40)
    w = Windows(np.zeros((200, 4, 1), np.float32), y, np.zeros(200, np.int64), 4 * np.arange(200))
    part = dirichlet(w, 7, 0.3, np.random.default_rng(0), window=4)
    allidx = np.concatenate([i for _, i in part])
    assert len(part) == 7 and np.array_equal(np.sort(allidx), np.arange(200))
    sizes = [len(i) for _, i in part]
    assert max(sizes) > min(sizes)  # non-IID


def test_drop_classes_label_skew() -> None:
    base = dict(synthetic={"num_classes": 6}, normalize="none")
    full = load_federated(syn(**base), 0)
    skew = load_federated(syn(drop_classes=2, **base), 0)
    assert skew.num_classes == 6
    have = {c.client_id: set(np.unique(c.train.y)) for c in full.clients}
    kept = [set(np.unique(np.concatenate([c.train.y, c.val.y, c.test.y]))) for c in skew.clients]
    for c, k in zip(skew.clients, kept, strict=True):
        assert k < have[c.client_id] and len(have[c.client_id] - k) == 2
    assert len({frozenset(k) for k in kept}) > 1  # different clients lose different classes
    assert max(max(k) for k in kept) == 5  # labels are not remapped


def test_held_out_and_max_clients() -> None:
    fd = load_federated(syn(held_out=2), 0)
    ids, new = {c.client_id for c in fd.clients}, {c.client_id for c in fd.new_clients}
    assert len(new) == 2 and len(ids) == 6 and not ids & new
    fd = load_federated(syn(held_out=["s01", "s03"]), 0)
    assert [c.client_id for c in fd.new_clients] == ["s01", "s03"]
    fd = load_federated(syn(max_clients=3, partition="dirichlet", num_clients=5), 0)
    assert [c.client_id for c in fd.clients] == ["c00", "c01", "c02"]
    with pytest.raises(ConfigError, match=r"dataset.held_out.*'s99'.*valid: s01"):
        load_federated(syn(held_out=["s99"]), 0)
    with pytest.raises(ConfigError, match="dataset.held_out"):
        load_federated(syn(held_out=8), 0)


def test_min_windows_drops_clients() -> None:
    fd = load_federated(
        syn(partition="dirichlet", num_clients=12, dirichlet_alpha=0.1, min_windows=20), 0
    )
    assert fd.info["dropped_clients"]
    assert all(len(c.train) >= 20 for c in fd.clients)


# ----------------------------------------------------------------------------- normalisation


def test_normalise_client_uses_train_only() -> None:
    fd = load_federated(syn(held_out=1, synthetic={"subject_shift": 1.0}), 0)
    for c in all_clients(fd):
        x = c.train.x.reshape(-1, c.train.x.shape[-1])
        assert np.allclose(x.mean(0), 0, atol=1e-4) and np.allclose(x.std(0), 1, atol=1e-3)
        t = c.test.x.reshape(-1, x.shape[-1])
        assert not np.allclose(t.mean(0), 0, atol=1e-3)


def test_normalise_global_uses_training_clients() -> None:
    raw = load_federated(syn(held_out=2, normalize="none"), 0)
    glob = load_federated(syn(held_out=2, normalize="global"), 0)
    pooled = np.concatenate([c.train.x for c in raw.clients]).reshape(-1, 3)
    mean, std = pooled.mean(0), pooled.std(0)
    both = np.concatenate([c.train.x for c in glob.clients]).reshape(-1, 3)
    assert np.allclose(both.mean(0), 0, atol=1e-4) and np.allclose(both.std(0), 1, atol=1e-3)
    for a, b in zip(raw.new_clients, glob.new_clients, strict=True):
        assert np.allclose((a.test.x - mean) / std, b.test.x, atol=1e-4)
        assert not np.allclose(b.train.x.reshape(-1, 3).mean(0), 0, atol=1e-3)


# ----------------------------------------------------------------------------- determinism, cache


def _arrays(fd: FederatedData) -> list[np.ndarray]:
    return [
        a for c in all_clients(fd) for s in (c.train, c.val, c.test) for a in (s.x, s.y, s.start)
    ]


def test_determinism() -> None:
    cfg = syn(partition="dirichlet", split="stratified", held_out=1)
    a, b = load_federated(cfg, 5), load_federated(cfg, 5)
    assert all(np.array_equal(x, y) for x, y in zip(_arrays(a), _arrays(b), strict=True))
    c = load_federated(cfg, 6)
    sizes = [[len(k.train) for k in f.clients] for f in (a, c)]
    assert sizes[0] != sizes[1]
    fixed = syn(partition="dirichlet", seed=11)  # dataset.seed overrides the run seed
    assert all(
        np.array_equal(x, y)
        for x, y in zip(
            _arrays(load_federated(fixed, 1)), _arrays(load_federated(fixed, 2)), strict=True
        )
    )


def test_cache_hit_and_corrupt(tmp_path: Path) -> None:
    cfg = syn(cache_dir=str(tmp_path), partition="dirichlet")
    first = load_federated(cfg, 0)
    files = list(tmp_path.glob("*.pkl"))
    assert len(files) == 1
    t = time.perf_counter()
    second = load_federated(cfg, 0)
    assert time.perf_counter() - t < 0.5
    assert all(np.array_equal(x, y) for x, y in zip(_arrays(first), _arrays(second), strict=True))
    files[0].write_bytes(b"garbage")
    third = load_federated(cfg, 0)
    assert all(np.array_equal(x, y) for x, y in zip(_arrays(first), _arrays(third), strict=True))
    assert files[0].stat().st_size > 100  # rebuilt
    load_federated(cfg, 1)
    assert len(list(tmp_path.glob("*.pkl"))) == 2  # the seed is part of the key


def test_synthetic_is_learnable() -> None:
    torch = pytest.importorskip("torch")
    fd = load_federated(syn(window=64, synthetic={"noise": 0.3}), 0)
    xtr = torch.tensor(np.concatenate([c.train.x for c in fd.clients])).transpose(1, 2)
    ytr = torch.tensor(np.concatenate([c.train.y for c in fd.clients]))
    xte = torch.tensor(np.concatenate([c.test.x for c in fd.clients])).transpose(1, 2)
    yte = torch.tensor(np.concatenate([c.test.y for c in fd.clients]))
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: extra threads only add contention
    net = torch.nn.Sequential(
        torch.nn.Conv1d(3, 16, 5), torch.nn.ReLU(), torch.nn.Conv1d(16, 16, 5), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool1d(1), torch.nn.Flatten(), torch.nn.Linear(16, 4),
    )  # fmt: skip
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(60):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xtr), ytr).backward()
        opt.step()
    torch.set_num_threads(threads)
    acc = (net(xte).argmax(1) == yte).float().mean().item()
    assert acc > 0.9


# ----------------------------------------------------------------------------- errors


def test_error_missing_root(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"set dataset.root=.*docs/data.md"):
        load_federated(DatasetConfig(name="usc_had", cache_dir=None), 0)
    with pytest.raises(DataError, match=r"does not exist.*set dataset.root="):
        load_raw(DatasetConfig(name="uci_hapt", root=str(tmp_path / "nope")))
    with pytest.raises(DataError, match="no USC-HAD files"):
        load_raw(DatasetConfig(name="usc_had", root=str(tmp_path)))
    with pytest.raises(DataError, match="no UCI HAPT files"):
        load_raw(DatasetConfig(name="uci_hapt", root=str(tmp_path)))


def test_error_unknown_dataset_and_channel() -> None:
    with pytest.raises(ConfigError, match="unknown dataset 'wisdm'; known: synthetic"):
        load_federated(DatasetConfig(name="wisdm"), 0)
    with pytest.raises(ConfigError, match=r"dataset.channels.*'acc_x'.*available: ch0, ch1, ch2"):
        load_federated(syn(channels=["ch0", "acc_x"]), 0)
    with pytest.raises(ConfigError, match="dataset.classes"):
        load_federated(syn(classes=[0, 9]), 0)


def test_error_corrupt_mat(tmp_path: Path) -> None:
    bad = tmp_path / "Subject2" / "a1t1.mat"
    bad.parent.mkdir()
    bad.write_bytes(b"MATLAB 5.0 MAT-file" + bytes(range(256)) * 4)
    with pytest.raises(DataError, match=r"cannot read .*Subject2/a1t1\.mat.*re-download"):
        load_raw(DatasetConfig(name="usc_had", root=str(tmp_path)))


def test_error_truncated_gz(hapt_root: Path, tmp_path: Path) -> None:
    root = hapt_slice(hapt_root, tmp_path)
    gz = root / "RawData/acc_exp01_user01.txt.gz"
    gz.write_bytes(gz.read_bytes()[:5000])
    with pytest.raises(DataError, match=r"cannot read .*acc_exp01_user01\.txt\.gz"):
        load_raw(DatasetConfig(name="uci_hapt", root=str(root)))


def test_error_acc_gyro_mismatch_and_bad_labels(tmp_path: Path) -> None:
    raw = tmp_path / "RawData"
    raw.mkdir()
    (raw / "acc_exp01_user01.txt").write_text("0 0 1\n" * 10)
    (raw / "gyro_exp01_user01.txt").write_text("0 0 0\n" * 9)
    (raw / "labels.txt").write_text("1 1 1 1 5\n")
    with pytest.raises(DataError, match=r"10 rows but .*gyro_exp01_user01\.txt has 9"):
        load_raw(DatasetConfig(name="uci_hapt", root=str(tmp_path)))
    (raw / "gyro_exp01_user01.txt").write_text("0 0 0\n" * 10)
    (raw / "labels.txt").write_text("1 1 1 1 50\n")
    with pytest.raises(DataError, match=r"labels\.txt.*out of range"):
        load_raw(DatasetConfig(name="uci_hapt", root=str(tmp_path)))
    (raw / "labels.txt").write_text("1 1 1 1 8\n")
    (raw / "gyro_exp01_user01.txt").write_text("0 0 0\n" * 9 + "nan 0 0\n")
    with pytest.raises(DataError, match=r"gyro_exp01_user01\.txt has 1 NaN/inf.*clean"):
        load_raw(DatasetConfig(name="uci_hapt", root=str(tmp_path)))


def test_error_nan_in_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    real = synthetic.generate

    def poisoned(cfg: SyntheticConfig, seed: int = 0) -> RawDataset:
        ds = real(cfg, seed)
        ds.recordings[5].signal[3, 1] = np.inf
        return ds

    monkeypatch.setattr(synthetic, "generate", poisoned)
    with pytest.raises(DataError, match=r"recording c1 of subject 2 .*NaN/inf.*clean"):
        load_federated(syn(), 0)


def test_error_nothing_left() -> None:
    with pytest.raises(DataError, match="dataset.min_windows"):
        load_federated(syn(min_windows=1000), 0)
    with pytest.raises(DataError, match="lower dataset.window"):
        load_federated(syn(window=5000), 0)
