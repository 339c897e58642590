"""What Meta-HAR and FedMAT need from the data layer and the local loop (SPECS 2.1, 2.4, 3.3):
label skew as a range of removed classes, several datasets merged into one federation (one
class list, one rate, clients tagged with their source), and drop-last batching."""

from __future__ import annotations

import hashlib
import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedwear.config import load_config
from fedwear.data import DATASETS, load_federated, merged
from fedwear.data.cache import cache_key
from fedwear.data.config import DatasetConfig, SyntheticConfig
from fedwear.data.partition import drop_classes, rng_for
from fedwear.data.preprocess import resample
from fedwear.data.synthetic import generate
from fedwear.data.types import FederatedData
from fedwear.errors import ConfigError, DataError
from fedwear.methods.training import train_epochs

# ----------------------------------------------------------------------------- helpers


def syn(**kw: object) -> DatasetConfig:
    base: dict[str, object] = {"name": "synthetic", "cache_dir": None, "window": 32, "normalize": "none"}
    base["synthetic"] = SyntheticConfig(seconds_per_class=12.0, num_classes=6)
    base.update(kw)
    return DatasetConfig(**base)


def classes_of(fd: FederatedData) -> dict[str, list[int]]:
    return {
        c.client_id: sorted(set(np.concatenate([c.train.y, c.val.y, c.test.y]).tolist()))
        for c in fd.clients + fd.new_clients
    }


def digest(fd: FederatedData) -> str:
    """sha256 over the client ids and every window's label, recording and start (integers only,
    so it does not depend on float rounding of the synthetic signals)."""
    h = hashlib.sha256()
    for c in fd.clients + fd.new_clients:
        h.update(c.client_id.encode())
        for s in (c.train, c.val, c.test):
            for a in (s.y, s.recording, s.start):
                h.update(np.ascontiguousarray(a, np.int64).tobytes())
    return h.hexdigest()


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The merged dataset in the registry while the test runs."""
    monkeypatch.setitem(DATASETS, merged.NAME, merged)
    return merged


def two_synthetic(**kw: object) -> DatasetConfig:
    """Source a: 3 subjects at 50 Hz, classes 0 and 1 as walk and run; source b: 2 subjects at
    100 Hz, classes 0 and 2 as run and sit; merged at 25 Hz (b kept at 50 Hz when asked)."""
    b_rate = kw.pop("b_rate", None)
    base: dict[str, object] = {
        "name": "merged", "cache_dir": None, "rate_hz": 25.0, "window": 20, "normalize": "none",
        "sources": [
            {"name": "synthetic", "tag": "a", "classes": {"class0": "walk", "class1": "run"},
             "synthetic": {"num_subjects": 3, "rate_hz": 50.0, "seconds_per_class": 8.0}},
            {"name": "synthetic", "tag": "b", "classes": {0: "run", 2: "sit"}, "rate_hz": b_rate,
             "synthetic": {"num_subjects": 2, "rate_hz": 100.0, "seconds_per_class": 8.0}},
        ],
    }  # fmt: skip
    base.update(kw)
    return DatasetConfig(**base)


USC_CLASSES = {  # Meta-HAR keeps Standing, Sitting, Walking, Upstairs, Downstairs, Running
    "Walking Forward": "Walking", "Walking Upstairs": "Upstairs",
    "Walking Downstairs": "Downstairs", "Running Forward": "Running", "Sitting": "Sitting",
    "Standing": "Standing",
}  # fmt: skip
HAPT_CLASSES = {  # UCI HAPT's 6 basic activities
    "WALKING": "Walking", "WALKING_UPSTAIRS": "Upstairs", "WALKING_DOWNSTAIRS": "Downstairs",
    "SITTING": "Sitting", "STANDING": "Standing", "LAYING": "Lying",
}  # fmt: skip


# ----------------------------------------------------------------------------- label skew

#: Computed with the implementation before ranges existed (a count only): kept classes per
#: client and the digest of every window's label, recording and start.
COUNT_EXPECTED = {
    (2, "time"): (
        "376f9df9cc9a8540ad6c6b0fa61d17a921f821d0cddfb65dbbdb9654f2abca3d",
        {"s01": [0, 1, 4, 5], "s02": [2, 3, 4, 5], "s03": [0, 1, 2, 5], "s04": [0, 1, 2, 3],
         "s05": [0, 2, 3, 4], "s06": [0, 2, 4, 5], "s07": [0, 2, 3, 5], "s08": [2, 3, 4, 5]},
    ),
    (3, "stratified"): (
        "7d0da976fd0a8f028b9faf3aeabb3bcc4798fe0be32fd3e6abefce43d5d26228",
        {"s01": [0, 1, 5], "s02": [2, 3, 4], "s03": [0, 1, 5], "s04": [0, 2, 5], "s05": [0, 2, 3],
         "s06": [0, 3, 4], "s07": [0, 4, 5], "s08": [2, 3, 4]},
    ),
    (1, "time"): (
        "b44ee4523cf57544f11ccefa3cd4f2fc9238b3151208f428b19fc8156f21ace4",
        {"s01": [0, 1, 2, 4, 5], "s02": [0, 1, 3, 4, 5], "s03": [0, 1, 2, 3, 5],
         "s04": [0, 1, 2, 3, 4], "s05": [0, 2, 3, 4, 5], "s06": [0, 1, 3, 4, 5],
         "s07": [0, 1, 2, 3, 5], "s08": [1, 2, 3, 4, 5]},
    ),
}  # fmt: skip


@pytest.mark.parametrize(("k", "split"), list(COUNT_EXPECTED))
def test_a_count_of_dropped_classes_is_unchanged(k: int, split: str) -> None:
    fd = load_federated(syn(drop_classes=k, split=split), 0)
    expected_digest, expected_classes = COUNT_EXPECTED[(k, split)]
    assert classes_of(fd) == expected_classes
    assert digest(fd) == expected_digest


def test_drop_classes_function_count_draws_unchanged() -> None:
    y = np.repeat(np.arange(5), 4)
    idx = np.arange(20)
    kept = {k: sorted(set(y[drop_classes(y, idx, k, rng_for(7, 2, 11))].tolist())) for k in (1, 2, 4, 9)}
    assert kept == {1: [0, 2, 3, 4], 2: [1, 3, 4], 4: [3], 9: [3]}


def test_range_of_dropped_classes() -> None:
    cfg = syn(drop_classes=[0, 2], synthetic=SyntheticConfig(
        seconds_per_class=12.0, num_classes=6, num_subjects=24))  # fmt: skip
    full = classes_of(load_federated(cfg.model_copy(update={"drop_classes": 0}), 0))
    skew = load_federated(cfg, 0)
    kept = classes_of(skew)
    removed = {c: len(full[c]) - len(kept[c]) for c in kept}
    assert all(set(kept[c]) <= set(full[c]) and 0 <= removed[c] <= 2 for c in kept)
    assert set(removed.values()) == {0, 1, 2}  # each count happens among 24 clients
    assert max(max(v) for v in kept.values()) == 5  # labels are not remapped
    assert digest(load_federated(cfg, 0)) == digest(skew)  # deterministic
    assert digest(load_federated(cfg, 1)) != digest(skew)  # and driven by the seed
    # at least one class stays, however many the range asks for
    few = load_federated(syn(drop_classes=[2, 9], synthetic={"num_classes": 3}), 0)
    assert len(few.clients) == 8
    assert all(len(v) == 1 for v in classes_of(few).values())


def test_drop_classes_function_range() -> None:
    y = np.repeat(np.arange(4), 3)
    idx = np.arange(12)
    assert np.array_equal(drop_classes(y, idx, (0, 0), rng_for(1, 2)), idx)
    for seed in range(20):
        out = drop_classes(y, idx, (1, 3), rng_for(seed, 2))
        left = set(y[out].tolist())
        assert 1 <= len(left) <= 3 and np.array_equal(out, idx[np.isin(y, list(left))])


@pytest.mark.parametrize("bad", [-1, [2, 1], [-1, 2], [0, 1, 2], [1]])
def test_drop_classes_rejects(bad: object) -> None:
    with pytest.raises(ValidationError):
        DatasetConfig(drop_classes=bad)
    with pytest.raises(ConfigError, match="dataset.drop_classes"):
        load_config(data={"dataset": {"drop_classes": bad}})


# ----------------------------------------------------------------------------- merged datasets


def test_merge_of_two_synthetic_sources_at_two_rates(registered: types.ModuleType) -> None:
    fd = load_federated(two_synthetic(), 0)
    assert fd.class_names == ["walk", "run", "sit"] and fd.rate_hz == 25.0
    ids = [c.client_id for c in fd.clients]
    assert ids == ["a-s01", "a-s02", "a-s03", "b-s01", "b-s02"]
    meta = fd.info["client_meta"]
    assert {c: m["source"] for c, m in meta.items()} == {c: c[0] for c in ids}
    assert fd.info["sources"]["a"] == {
        "dataset": "synthetic", "rate_hz": 25.0, "clients": ids[:3], "held_out": []
    }
    kept = classes_of(fd)
    assert all(kept[c] == [0, 1] for c in ids[:3]) and all(kept[c] == [1, 2] for c in ids[3:])
    # 8 s per class at 25 Hz = 200 samples = 10 windows of 20; two classes per subject
    assert fd.info["num_windows"] == (3 + 2) * 2 * 10
    assert fd.info["recordings"][0] == "a-s01/c0"

    # a window is the source's signal resampled to 25 Hz: source b, subject 1, its class 2 ("sit")
    raw = generate(SyntheticConfig(num_subjects=2, rate_hz=100.0, seconds_per_class=8.0))
    rec = resample(next(r for r in raw.recordings if r.subject == "1" and r.session == "c2"), 25.0)
    c = fd.clients[3]
    win = np.concatenate([c.train.x, c.test.x])[np.concatenate([c.train.y, c.test.y]) == 2]
    starts = np.concatenate([c.train.start, c.test.start])[np.concatenate([c.train.y, c.test.y]) == 2]
    for x, s in zip(win, starts, strict=True):
        np.testing.assert_array_equal(x, rec.signal[s : s + 20])


def test_a_source_keeps_its_own_rate(registered: types.ModuleType) -> None:
    """Meta-HAR resamples each source to its own rate (HHAR 25 Hz, USC-HAD 50 Hz)."""
    fd = load_federated(two_synthetic(b_rate=50.0), 0)
    assert fd.rate_hz == 25.0 and fd.info["sources"]["b"]["rate_hz"] == 50.0
    assert fd.info["num_windows"] == 3 * 2 * 10 + 2 * 2 * 20


@pytest.mark.parametrize(
    ("by", "ids"),
    [
        (["subject"], ["a-s01", "a-s02", "a-s03", "b-s01", "b-s02"]),
        (["source", "subject"], ["a-s01", "a-s02", "a-s03", "b-s01", "b-s02"]),
        (["source"], ["a", "b"]),
        (["subject", "session"], ["a-s01-c0", "a-s01-c1", "a-s02-c0"]),
    ],
)
def test_client_by_with_sources(registered: types.ModuleType, by: list[str], ids: list[str]) -> None:
    fd = load_federated(two_synthetic(client_by=by), 0)
    assert [c.client_id for c in fd.clients][: len(ids)] == ids
    assert all(m["source"] == c[0] for c, m in fd.info["client_meta"].items())


def test_source_groups_held_out_and_normalisation(registered: types.ModuleType) -> None:
    fd = load_federated(two_synthetic(held_out=["a-s02", "b-s01"], normalize="group",
                                      normalize_group=["source"]), 0)  # fmt: skip
    assert fd.info["sources"]["a"]["held_out"] == ["a-s02"]
    assert fd.info["sources"]["b"] == {
        "dataset": "synthetic", "rate_hz": 25.0, "clients": ["b-s02"], "held_out": ["b-s01"]
    }
    assert list(fd.info["normalize"]["groups"]) == ["source=a", "source=b"]


def test_held_out_per_source_draws_from_each_source(registered: types.ModuleType) -> None:
    """Meta-HAR's merged set holds out one meta-test user from each source (SPECS 2.1)."""
    for seed in range(4):
        fd = load_federated(two_synthetic(held_out=1, held_out_per="source"), seed)
        assert [len(fd.info["sources"][s]["held_out"]) for s in ("a", "b")] == [1, 1]
    draws = {tuple(load_federated(two_synthetic(held_out=1, held_out_per="source"), seed).info["held_out"])
             for seed in range(8)}
    assert len(draws) > 2  # drawn with the seed, not fixed
    with pytest.raises(ConfigError, match=r"held_out=2 must be in 0\.\.1 .* among the source=b clients"):
        load_federated(two_synthetic(held_out=2, held_out_per="source"), 0)
    with pytest.raises(ConfigError, match=r"held_out_per=device: client 'a-s01' has no device value"):
        load_federated(two_synthetic(held_out=1, held_out_per="device"), 0)
    with pytest.raises(ConfigError, match="held_out_per draws a number of clients per group"):
        load_config(data={"dataset": {"held_out": ["s01"], "held_out_per": "source"}})


def test_merge_errors(registered: types.ModuleType, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^dataset.rate_hz is required for dataset.name=merged"):
        load_federated(two_synthetic(rate_hz=None), 0)
    with pytest.raises(ConfigError, match=r"^dataset.sources is empty"):
        load_federated(DatasetConfig(name="merged", cache_dir=None, rate_hz=50.0), 0)
    bad_class = two_synthetic()
    bad_class.sources[1].classes = {"class9": "x"}
    with pytest.raises(ConfigError, match=r"dataset.sources\[1\].classes: 'class9' is not a class"):
        load_federated(bad_class, 0)
    missing = {"name": "merged", "cache_dir": None, "rate_hz": 50.0, "sources": [
        {"name": "synthetic", "classes": {}}, {"name": "usc_had", "root": str(tmp_path / "nope")},
    ]}  # fmt: skip
    with pytest.raises(DataError, match=r"^dataset.sources\[1\] \(usc_had\): root '.*nope' does not exist"):
        load_federated(DatasetConfig(**missing), 0)
    from_parent = {**missing, "root": str(tmp_path), "sources": [missing["sources"][0], {"name": "usc_had"}]}
    with pytest.raises(DataError, match=r"usc_had' does not exist .*: dataset.root \(--root of fedwear reproduce\) "
                       r"must be the folder holding a usc_had/ folder"):
        load_federated(DatasetConfig(**from_parent), 0)
    missing["sources"][1] = {"name": "usc_had"}  # no root, and no bundled USC-HAD
    with pytest.raises(ConfigError, match=r"^dataset.sources\[1\] \(usc_had\): root is not set"):
        load_federated(DatasetConfig(**missing), 0)
    empty = tmp_path / "empty"
    empty.mkdir()
    missing["sources"][1] = {"name": "usc_had", "root": str(empty)}
    with pytest.raises(DataError, match=r"^dataset.sources\[1\] \(usc_had\): no USC-HAD files"):
        load_federated(DatasetConfig(**missing), 0)
    missing["sources"][1] = {"name": "ppg_dalia_hr"}
    with pytest.raises(ConfigError, match=r"sources\[1\].name: 'ppg_dalia_hr' cannot be merged"):
        load_federated(DatasetConfig(**missing), 0)
    with pytest.raises(ConfigError, match=r"no channel\(s\) \['acc_x'\]"):
        load_federated(two_synthetic(channels=["acc_x"]), 0)


def test_sources_config_checks(registered: types.ModuleType) -> None:
    def one_line(tree: dict) -> str:
        with pytest.raises(ConfigError) as e:
            load_config(data={"dataset": tree})
        assert "\n" not in str(e.value)
        return str(e.value)

    src = {"name": "usc_had", "root": "/x"}
    assert "read only by dataset.name=merged" in one_line({"sources": [src]})
    assert "sources[0]: unknown key 'rate'" in one_line(
        {"name": "merged", "sources": [{**src, "rate": 50}]}
    )
    assert "sources[0].synthetic: unknown key 'bogus'" in one_line(
        {"name": "merged", "sources": [{"name": "synthetic", "synthetic": {"bogus": 1}}]}
    )
    assert "tagged 'usc_had'" in one_line({"name": "merged", "sources": [src, src]})
    assert "dataset.sources.0.tag" in one_line({"name": "merged", "sources": [{**src, "tag": "a-b"}]})
    cfg = load_config(data={"dataset": {"name": "merged", "rate_hz": 50, "sources": [
        src, {**src, "tag": "again", "classes": {3: "Upstairs", "Sitting": "Sitting"}}]}})  # fmt: skip
    assert cfg.dataset.sources[1].classes == {3: "Upstairs", "Sitting": "Sitting"}


@pytest.mark.parametrize("with_cache", [False, True])
@pytest.mark.slow
def test_real_merge_usc_had_and_uci_hapt(data_root: Path, registered: types.ModuleType,
                                         tmp_path: Path, with_cache: bool) -> None:  # fmt: skip
    """Meta-HAR's merged set on our data: USC-HAD's 6 kept activities and UCI HAPT's 6 basic
    ones at 50 Hz in 150-sample (3 s) windows; 5 activities are shared, so 7 in all (as HHAR and
    USC-HAD share 5 of their 7 in the paper, SPECS 2.1)."""
    # with the cache: the sources found under dataset.root (metahar:table2-merged's --root), one
    # meta-test user from each; without: each source's own root, two meta-test users from all
    roots = [{"root": str(data_root / n)} if not with_cache else {} for n in ("usc_had", "uci_hapt")]
    cfg = DatasetConfig(
        name="merged", rate_hz=50.0, window=150, drop_classes=[0, 2],
        cache_dir=str(tmp_path) if with_cache else None,
        root=str(data_root) if with_cache else None,
        **({"held_out": 1, "held_out_per": "source"} if with_cache else {"held_out": 2}),
        sources=[
            {"name": "usc_had", "classes": USC_CLASSES, **roots[0]},
            {"name": "uci_hapt", "classes": HAPT_CLASSES, **roots[1]},
        ],
    )  # fmt: skip
    fd = load_federated(cfg, 0)
    if with_cache:
        assert [len(fd.info["sources"][s]["held_out"]) for s in ("usc_had", "uci_hapt")] == [1, 1]
    assert fd.class_names == merged.CLASS_NAMES
    assert fd.rate_hz == 50.0 and fd.window == 150 and fd.channels == merged.CHANNELS
    src = fd.info["sources"]
    assert len(src["usc_had"]["clients"] + src["usc_had"]["held_out"]) == 14
    assert len(src["uci_hapt"]["clients"] + src["uci_hapt"]["held_out"]) == 30
    seen = {"usc_had": set(), "uci_hapt": set()}
    for c in fd.clients + fd.new_clients:
        source = fd.info["client_meta"][c.client_id]["source"]
        assert c.client_id.startswith(f"{source}-s")
        seen[source] |= set(np.unique(c.train.y).tolist())
    names = fd.class_names
    assert {names[i] for i in seen["usc_had"]} == set(USC_CLASSES.values())
    assert {names[i] for i in seen["uci_hapt"]} == set(HAPT_CLASSES.values())
    if with_cache:
        assert len(list(tmp_path.glob("merged-*.pkl"))) == 1
        again = load_federated(cfg, 0)
        assert digest(again) == digest(fd)


def test_cache_keys(tmp_path: Path, registered: types.ModuleType) -> None:
    # at their defaults the new keys leave the key as before; a count of classes as well
    assert cache_key(DatasetConfig(), 0, [], None) == (
        "6259880a59631da67104ef9be5bf1257f89a0b2df3f0dc9006cd30fa93a9724d"
    )
    assert cache_key(DatasetConfig(drop_classes=2), 0, [], None) == (
        "af4574c141580c90cf232cae2ab0e2616449dccaefe6ade71a569d37da8771e2"
    )
    keys = {cache_key(DatasetConfig(drop_classes=k), 0, [], None) for k in (2, [0, 2], [2, 2], [0, 1])}
    assert len(keys) == 4
    a, b = two_synthetic(), two_synthetic(b_rate=50.0)
    c = two_synthetic()
    c.sources[0].classes = {"class0": "walk"}
    assert len({cache_key(x, 0, [], None) for x in (a, b, c)}) == 3
    # a merged entry follows its sources' files
    root = tmp_path / "usc"
    (root / "Subject1").mkdir(parents=True)
    f = root / "Subject1" / "a1t1.mat"
    f.write_bytes(b"0")
    cfg = DatasetConfig(name="merged", rate_hz=50.0, sources=[{"name": "usc_had", "root": str(root)}])
    before = cache_key(cfg, 0, [], None)
    f.write_bytes(b"01")
    assert cache_key(cfg, 0, [], None) != before
    # end to end: changed sources rebuild, unchanged ones are read back
    cached = {"cache_dir": str(tmp_path / "cache")}
    x = load_federated(two_synthetic(**cached), 0)
    y = load_federated(two_synthetic(b_rate=50.0, **cached), 0)
    assert x.info["num_windows"] != y.info["num_windows"]
    assert len(list((tmp_path / "cache").glob("merged-*.pkl"))) == 2
    assert digest(load_federated(two_synthetic(**cached), 0)) == digest(x)


# ----------------------------------------------------------------------------- drop_last


def _train(n: int, drop_last: bool, batch: int = 4, epochs: int = 3) -> tuple[float, list[list[int]], int, torch.nn.Module]:
    """train_epochs on n windows of a linear model; the batches seen and the epochs ended."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 3)
    x = torch.arange(2.0 * n).reshape(n, 2) / n
    y = torch.arange(n) % 3
    seen: list[list[int]] = []
    ends = []

    def loss_fn(m: torch.nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        seen.append((xb[:, 0] * n / 2).round().long().tolist())
        return torch.nn.functional.cross_entropy(m(xb), yb)

    loss = train_epochs(
        model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, epochs=epochs, batch_size=batch,
        generator=torch.Generator().manual_seed(5), loss_fn=loss_fn,
        after_epoch=lambda: ends.append(1), drop_last=drop_last,
    )  # fmt: skip
    return loss, seen, len(ends), model


def test_drop_last_skips_the_partial_batch() -> None:
    keep_loss, keep, keep_ends, _ = _train(10, False)
    drop_loss, drop, drop_ends, _ = _train(10, True)
    assert [len(b) for b in keep] == [4, 4, 2] * 3 and [len(b) for b in drop] == [4, 4] * 3
    assert keep_ends == drop_ends == 3
    # the same permutation per epoch: drop_last uses its first full batches
    assert drop[:2] == keep[:2] and drop[2:4] == keep[3:5] and drop[4:] == keep[6:8]
    assert math.isfinite(drop_loss) and math.isfinite(keep_loss)
    # a multiple of the batch size: identical to keeping the last batch
    a, b = _train(8, False), _train(8, True)
    assert a[0] == b[0] and a[1] == b[1]


def test_drop_last_with_fewer_windows_than_a_batch_trains_no_step() -> None:
    torch.manual_seed(0)
    before = {k: v.clone() for k, v in torch.nn.Linear(2, 3).state_dict().items()}
    loss, seen, ends, model = _train(3, True)
    assert math.isnan(loss) and seen == [] and ends == 3
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    loss, seen, _, _ = _train(3, False)
    assert len(seen) == 3 and math.isfinite(loss)
