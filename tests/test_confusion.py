"""confusion.csv: the pooled confusion counts a classification run writes beside metrics.csv
(round x view x split x true x predicted class, summed over clients), what they must equal, and
the run-folder rules they follow (resume, overwrite, older folders, every in-process engine)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import confusion_matrix, f1_score

import fedwear
from fedwear import rundir
from fedwear.callbacks import CONFUSION_COLUMNS, CONFUSION_FILE
from fedwear.evaluation.metrics import confusion_counts, macro_f1, per_class_f1
from tests.helpers import tiny_config, tiny_regression_config

KEYS = ["round", "view", "split"]


def matrices(frame: pd.DataFrame, q: int) -> dict[tuple, np.ndarray]:
    """``{(round, view, split): [q, q] counts}`` of a confusion.csv frame."""
    out = {}
    for key, g in frame.groupby(KEYS, sort=False):
        m = np.zeros((q, q), np.int64)
        np.add.at(m, (g["true"].to_numpy(), g["pred"].to_numpy()), g["count"].to_numpy())
        out[key] = m
    return out


def test_counts_and_per_class_f1_are_sklearns():
    rng = np.random.default_rng(0)
    y, pred = rng.integers(0, 5, 200), rng.integers(0, 4, 200)  # class 4 never predicted
    y[y == 3] = 2  # class 3 never true
    got = confusion_counts(y, pred, 6)  # class 5: neither
    np.testing.assert_array_equal(got, confusion_matrix(y, pred, labels=range(6)))
    f1 = per_class_f1(got)
    present = sorted(set(y) | set(pred))
    np.testing.assert_allclose(f1[present], f1_score(y, pred, labels=present, average=None, zero_division=0),
                               rtol=0, atol=1e-15)
    assert np.isnan(f1[5]) and not np.isnan(f1[:5]).any()
    assert np.nanmean(f1) == pytest.approx(macro_f1(y, pred), abs=1e-15)
    with pytest.raises(ValueError, match="class index"):
        confusion_counts(y, pred, 4)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Clients of different sizes (Dirichlet), every view including the pooled global one."""
    out = tmp_path_factory.mktemp("confusion") / "run"
    cfg = tiny_config(**{"evaluation.views": "[personalized,generalization,global,global_pooled,new_clients]",
                         "dataset.partition": "dirichlet", "dataset.num_clients": 6})
    fedwear.run(cfg, out)
    return out


def test_confusion_equals_what_the_metrics_imply(run):
    """Per (round, view, split): the counts cover exactly the rows' windows, the pooled accuracy
    they give is the test-weighted mean of the clients' accuracies, and on the pooled global view
    (one row) the per-class F1 averages to that row's macro-F1."""
    conf = pd.read_csv(run / CONFUSION_FILE)
    assert list(conf.columns) == CONFUSION_COLUMNS and (conf["count"] > 0).all()
    metrics = pd.read_csv(run / "metrics.csv")
    mats = matrices(conf, 3)
    groups = dict(iter(metrics.groupby(KEYS, sort=False)))
    assert list(mats) == list(groups)  # every evaluated (round, view, split), in metrics.csv's order
    assert {v for _, v, _ in mats} == {"personalized", "generalization", "global", "global_pooled", "new_clients"}
    for key, g in groups.items():
        m = mats[key]
        assert m.sum() == g["n"].sum(), key
        assert np.trace(m) / m.sum() == pytest.approx(np.average(g["accuracy"], weights=g["n"]), abs=1e-12), key
        if key[1] == "global_pooled":
            assert np.nanmean(per_class_f1(m)) == pytest.approx(g["macro_f1"].item(), abs=1e-12)
    # the global model on each client's test split, pooled, is the global model on the pooled test set
    for r in metrics["round"].unique():
        np.testing.assert_array_equal(mats[(r, "global", "test")], mats[(r, "global_pooled", "test")])


def test_resume_drops_rows_after_the_checkpoint(tmp_path):
    """A run killed after writing round 3's rows but before its checkpoint (checkpoint_every: 2)
    continues from round 2: its confusion.csv ends exactly as an uninterrupted run's."""
    cfg = tiny_config(rounds=4, checkpoint_every=2)
    full = fedwear.run(cfg, tmp_path / "full")
    cut = tmp_path / "cut"
    fedwear.run(cfg, cut, until=2)
    for name in ("metrics.csv", "rounds.csv", CONFUSION_FILE):  # round 3's rows, then a torn line
        lines = (full.out_dir / name).read_text().splitlines()
        later = [ln for ln in lines[1:] if ln.split(",")[0] == "3"]
        assert later, name
        with (cut / name).open("a") as f:
            f.write("\n".join(later) + "\n3,per")
    fedwear.run(cfg, cut, resume=True)
    for name in ("metrics.csv", CONFUSION_FILE):
        assert (cut / name).read_bytes() == (full.out_dir / name).read_bytes(), name


def test_a_run_begun_without_the_file_is_continued_without_it(tmp_path):
    """A folder whose run began before fedwear recorded confusion counts gets none on resume
    (a file covering only the later rounds would be mistaken for the whole run's)."""
    cfg = tiny_config(rounds=4)
    out = tmp_path / "run"
    fedwear.run(cfg, out, until=2)
    (out / CONFUSION_FILE).unlink()
    fedwear.run(cfg, out, resume=True)
    assert not (out / CONFUSION_FILE).exists()
    assert pd.read_csv(out / "metrics.csv")["round"].max() == 4


def test_overwrite_removes_it_and_regression_writes_none(tmp_path):
    assert CONFUSION_FILE in rundir.RUN_FILES
    out = tmp_path / "run"
    fedwear.run(tiny_config(), out)
    assert (out / CONFUSION_FILE).is_file()
    fedwear.run(tiny_regression_config(), out, overwrite=True)
    assert not (out / CONFUSION_FILE).exists()  # removed, and a forecasting run has no classes


@pytest.mark.parametrize("method", ["fedavg", "local"])
@pytest.mark.slow
def test_sim_and_batched_write_the_same_file(tmp_path, method):
    cfg = tiny_config(method=method)
    sim = fedwear.run(cfg, tmp_path / "sim")
    fast = fedwear.run(cfg.model_copy(update={"engine": "batched"}), tmp_path / "batched")
    a, b = (r.out_dir / CONFUSION_FILE for r in (sim, fast))
    assert a.read_bytes() == b.read_bytes()
