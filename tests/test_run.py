"""End-to-end runs on synthetic data: determinism, resume, bytes, dropped replies, outputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

import fedwear
from fedwear.engines.runner import Callback
from fedwear.errors import FedwearError
from fedwear.evaluation.predictor import Predictor
from fedwear.methods.api import Record
from fedwear.methods.fedavg import FedAvg
from tests.helpers import tiny_config


def read(path):
    return path.read_bytes()


def test_same_seed_same_metrics_bit_for_bit(tmp_path):
    cfg = tiny_config()
    a = fedwear.run(cfg, tmp_path / "a")
    b = fedwear.run(cfg, tmp_path / "b")
    assert read(a.out_dir / "metrics.csv") == read(b.out_dir / "metrics.csv")
    assert read(a.out_dir / "rounds.csv") == read(b.out_dir / "rounds.csv")
    c = fedwear.run(tiny_config(seed=1), tmp_path / "c")
    assert read(a.out_dir / "metrics.csv") != read(c.out_dir / "metrics.csv")


def test_summary_has_the_fixed_keys(tmp_path):
    s = fedwear.run(
        tiny_config(**{"evaluation.targets": "{personalized.accuracy: 0.0}"}), tmp_path
    ).summary
    for key in (
        "final",
        "best",
        "best_rule",
        "rounds_to_target",
        "bytes_up",
        "bytes_down",
        "wall_time_s",
        "seed",
        "fedwear_version",
        "config_hash",
    ):
        assert key in s
    assert set(s["final"]) == {"personalized", "generalization", "global", "new_clients"}
    assert set(s["final"]["global"]) == {"accuracy", "macro_f1", "auc"}
    assert s["rounds_to_target"] == {"personalized.accuracy": 1}
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["config_hash"] == s["config_hash"]
    timing = pd.read_csv(tmp_path / "timing.csv")
    assert list(timing["round"]) == [1, 2, 3] and (timing["cpu_s"] > 0).all() and (timing["wall_s"] > 0).all()


class Interrupt(Callback):
    def __init__(self, after: int) -> None:
        self.after = after

    def on_round(self, runner, info):
        if info.round == self.after:
            raise KeyboardInterrupt


def test_resume_after_interrupt_equals_uninterrupted(tmp_path):
    cfg = tiny_config(rounds=5, **{"optimizer.persist": True})
    full = fedwear.run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, tmp_path / "cut", callbacks=[Interrupt(after=3)])
    assert pd.read_csv(tmp_path / "cut" / "metrics.csv")["round"].max() == 3
    resumed = fedwear.run(cfg, tmp_path / "cut", resume=True)
    assert read(resumed.out_dir / "metrics.csv") == read(full.out_dir / "metrics.csv")
    assert read(resumed.out_dir / "rounds.csv") == read(full.out_dir / "rounds.csv")
    assert resumed.summary["final"] == full.summary["final"]


@pytest.mark.slow
def test_resume_after_kill_equals_uninterrupted(tmp_path):
    """A real SIGKILL of `fedwear run` mid-run, then --resume."""
    cfg_path = tmp_path / "cfg.yaml"
    cfg = tiny_config(rounds=30, method="local", **{"evaluation.every": 10})
    cfg_path.write_text(fedwear.config.dump_config(cfg))
    cmd = [sys.executable, "-m", "fedwear.cli", "run", str(cfg_path), "--quiet"]
    full = subprocess.run([*cmd, "--out", str(tmp_path / "full")], capture_output=True, text=True)
    assert full.returncode == 0, full.stderr
    proc = subprocess.Popen(
        [*cmd, "--out", str(tmp_path / "cut")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    rounds = tmp_path / "cut" / "rounds.csv"
    deadline = time.time() + 120
    while time.time() < deadline:
        if rounds.exists() and len(rounds.read_text().splitlines()) > 12:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(rounds.read_text().splitlines()) - 1
    assert 0 < done < 30, "the kill did not land mid-run"
    res = subprocess.run(
        [*cmd, "--out", str(tmp_path / "cut"), "--resume"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert read(tmp_path / "cut" / "metrics.csv") == read(tmp_path / "full" / "metrics.csv")


def test_bytes_are_the_sum_of_message_arrays(tmp_path):
    # SmallCNN(width=8) on 3 channels and 3 classes, counted by hand: conv1 8*3*5 + 8, conv2
    # 16*8*5 + 16, head 16*3 + 3 = 835 float32 parameters (no buffers).
    model_bytes = 4 * (8 * 3 * 5 + 8 + 16 * 8 * 5 + 16 + 16 * 3 + 3)
    cfg = tiny_config()
    res = fedwear.run(cfg, tmp_path / "a")
    rounds = pd.read_csv(res.out_dir / "rounds.csv")
    assert (rounds["bytes_down"] == 3 * model_bytes).all()  # 3 clients per round
    assert (rounds["bytes_up"] == 3 * model_bytes).all()
    assert res.summary["bytes_up"] == cfg.rounds * 3 * model_bytes
    # evaluation: 6 training + 2 new clients each get their message and the global model; they
    # reply 4 numbers (n, accuracy, macro_f1, auc) per row: 3 views x 6 clients + 2 new-client rows
    assert (rounds["eval_bytes_down"] == 8 * 2 * model_bytes).all()
    assert (rounds["eval_bytes_up"] == (3 * 6 + 2) * 5 * 8).all()  # n, n_train and 3 metrics
    assert res.summary["eval_bytes_down"] == cfg.rounds * 8 * 2 * model_bytes
    local = fedwear.run(tiny_config(method="local"), tmp_path / "b").summary
    assert local["bytes_up"] == local["bytes_down"] == local["eval_bytes_down"] == 0


def test_fedprox_with_mu_zero_is_fedavg(tmp_path):
    a = fedwear.run(tiny_config(), tmp_path / "a")
    b = fedwear.run(
        tiny_config(method="fedprox", **{"method_options.fedprox.mu": 0.0}), tmp_path / "b"
    )
    assert read(a.out_dir / "metrics.csv") == read(b.out_dir / "metrics.csv")
    c = fedwear.run(
        tiny_config(method="fedprox", **{"method_options.fedprox.mu": 1.0}), tmp_path / "c"
    )
    assert read(a.out_dir / "metrics.csv") != read(c.out_dir / "metrics.csv")


def test_views_per_method(tmp_path):
    local = fedwear.run(tiny_config(method="local"), tmp_path / "l").summary
    assert "global" not in local["final"] and "personalized" in local["final"]
    central = fedwear.run(tiny_config(method="centralized"), tmp_path / "c").summary
    assert "global" in central["final"]
    rounds = pd.read_csv(tmp_path / "c" / "rounds.csv")
    assert (rounds["clients"] == "pooled").all()


class NaNReply(FedAvg):
    name = "nanreply"

    def fit(self, down, state, data, round, seed):
        up, st = super().fit(down, state, data, round, seed)
        if data.client_id == "s01":
            key = next(iter(up.arrays))
            up.arrays[key] = np.full_like(up.arrays[key], np.nan)
        if data.client_id == "s02":
            up = Record({k + "_x": v for k, v in up.arrays.items()}, up.scalars)
        return up, st


def test_malformed_replies_are_left_out(tmp_path, monkeypatch):
    from fedwear import methods

    monkeypatch.setitem(methods.METHODS, "nanreply", NaNReply)
    cfg = tiny_config(method="nanreply", clients_per_round=6, rounds=2)
    res = fedwear.run(cfg, tmp_path)
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert rounds["dropped"].str.contains("s01:array").all()
    assert rounds["dropped"].str.contains("s02:array names differ").all()
    assert np.isfinite(res.metrics["accuracy"]).all()
    assert "left out of aggregation" in (tmp_path / "run.log").read_text()


def test_new_clients_adapt_with_local(tmp_path):
    """Local's new clients train their own model for evaluation.adapt_epochs: with 0 epochs they
    keep the initial weights (chance level), with a budget they learn."""
    def new_client_rows(epochs, where):
        m = fedwear.run(tiny_config(method="local", **{"evaluation.adapt_epochs": epochs}), tmp_path / where).metrics
        return m[m["view"] == "new_clients"].reset_index(drop=True)

    untrained, adapted = new_client_rows(0, "e0"), new_client_rows(4, "e4")
    assert len(adapted) == 2 * 3  # 2 new clients x 3 rounds
    assert adapted["accuracy"].mean() > untrained["accuracy"].mean() + 0.2
    assert untrained["accuracy"].mean() < 0.6  # 3 balanced classes: near chance without training


def test_best_round_selected_on_validation_split(tmp_path):
    cfg = tiny_config(rounds=4, **{"dataset.val_fraction": 0.3, "evaluation.best_split": "val",
                                   "evaluation.best_metric": "global.accuracy"})
    res = fedwear.run(cfg, tmp_path)
    m = res.metrics
    assert set(m["split"]) == {"test", "val"}
    val = m[(m["view"] == "global") & (m["split"] == "val")]
    per_round = val.groupby("round").apply(lambda g: np.average(g["accuracy"], weights=g["n"]), include_groups=False)
    assert res.summary["best_round"] == int(per_round.idxmax())
    assert "val split" in res.summary["best_rule"]


def test_early_stopping_ends_the_run_and_checkpoints_it(tmp_path):
    cfg = tiny_config(rounds=30, **{"evaluation.patience": 1, "evaluation.best_metric": "global.accuracy"})
    res = fedwear.run(cfg, tmp_path)
    last = res.summary["final_round"]
    assert last < 30
    acc = res.metrics.query("view == 'global' and split == 'test'").groupby("round").apply(
        lambda g: np.average(g["accuracy"], weights=g["n"]), include_groups=False)
    assert acc.loc[last] <= acc.loc[: last - 1].max()  # it stopped because round `last` did not improve
    from fedwear.callbacks import load_checkpoint

    assert load_checkpoint(tmp_path / "checkpoint.npz")["round"] == last


def test_evaluation_runs_each_distinct_body_once_and_equals_computing_each(tmp_path, monkeypatch):
    """Equal models share forward passes across views and clients, each client's test logits are
    cut from the pooled test set's; the metrics equal computing every view on its own."""
    import fedwear.api
    from fedwear.engines import client, sim
    from fedwear.engines.client import EvalCache

    made: list[EvalCache] = []

    class Counting(EvalCache):
        def __init__(self):
            super().__init__()
            made.append(self)

    class NoSharing(EvalCache):
        def logits(self, round, pred, w, batch_size):
            return super().logits(round, Predictor(pred), w, batch_size)  # no keys: nothing shared

        def scores(self, round, pred, w, compute):
            return compute()

    scored = []
    real_metrics = client.classification_metrics
    monkeypatch.setattr(client, "classification_metrics", lambda *a: scored.append(1) or real_metrics(*a))
    monkeypatch.setattr(sim, "EvalCache", Counting)
    shared = fedwear.run(tiny_config(), tmp_path / "shared")
    # per round, the one global model over the pooled test set serves the personalized,
    # generalization and global views of all 6 training clients
    assert sum(c.forwards for c in made) == 3 * 1
    # and its metrics are computed once per window set: 6 own test sets (personalized = global),
    # the pooled test set, the 2 new clients' test sets
    assert len(scored) == 3 * (6 + 1 + 2)
    made.clear()
    fedwear.run(tiny_config(method="local"), tmp_path / "local")
    assert sum(c.forwards for c in made) == 3 * 6  # personal models differ: one pooled pass each
    for method, views, passes in (("fedavg", "[global]", 1), ("fedavg", "[personalized,global]", 1),
                                  ("local", "[personalized,global]", 6)):
        made.clear()
        fedwear.run(tiny_config(method=method, **{"evaluation.views": views}), tmp_path / f"{method}-{views}")
        # without the generalization view the global model still runs once over the pooled test
        # set; personal models run over their own test sets only
        assert sum(c.forwards for c in made) == 3 * passes, (method, views)

    monkeypatch.setattr(sim, "EvalCache", NoSharing)
    monkeypatch.setattr(fedwear.api, "test_slices", lambda data: {})  # own test sets run on their own
    each = fedwear.run(tiny_config(), tmp_path / "each")
    a, b = pd.read_csv(shared.out_dir / "metrics.csv"), pd.read_csv(each.out_dir / "metrics.csv")
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-9)


def test_until_pauses_a_run_that_resume_then_finishes_bit_for_bit(tmp_path):
    """``until``: stop after a round with a checkpoint and no summary.json (unfinished); the same
    call without it continues to the end with the metrics of an uninterrupted run."""
    from fedwear.api import run

    cfg = tiny_config(rounds=4, checkpoint_every=10)
    paused = run(cfg, tmp_path / "p", until=2)
    assert paused.summary["paused_at"] == 2 and not (tmp_path / "p" / "summary.json").exists()
    assert pd.read_csv(tmp_path / "p" / "rounds.csv")["round"].tolist() == [1, 2]
    again = run(cfg, tmp_path / "p", resume=True, until=2)  # already there: nothing runs
    assert again.summary["paused_at"] == 2 and pd.read_csv(tmp_path / "p" / "rounds.csv")["round"].max() == 2
    done = run(cfg, tmp_path / "p", resume=True)
    assert (tmp_path / "p" / "summary.json").exists() and "paused_at" not in done.summary
    ref = run(cfg, tmp_path / "ref")
    assert (tmp_path / "p" / "metrics.csv").read_bytes() == (ref.out_dir / "metrics.csv").read_bytes()


def test_a_paused_checkpoint_leaves_out_only_the_trained_models_the_next_fit_rebuilds(tmp_path):
    """``personal_model: trained``: a checkpoint before the last round leaves out the ``trained.``
    model of the clients that fit first in the next round (their fit rebuilds it unread) and keeps
    the others' (evaluated before they train again); the continuation equals an uninterrupted run
    bit for bit, and the last round's checkpoint keeps every model."""
    from fedwear.api import run
    from fedwear.callbacks import load_checkpoint
    from fedwear.seeding import client_schedule

    def has_trained(state):
        return any(k.startswith("trained.") for k in state.arrays)

    for per_round in (6, 3):  # all 6 clients, then half of them each round
        cfg = tiny_config(rounds=4, clients_per_round=per_round, **{"evaluation.personal_model": "trained"})
        out = tmp_path / f"p{per_round}"
        run(cfg, out, until=2)
        states = load_checkpoint(out / "checkpoint.npz")["clients"]
        schedule = client_schedule(cfg.seed, ["s01", "s02", "s03", "s05", "s06", "s07"], cfg.rounds, per_round)
        kept = set(schedule[0] + schedule[1]) - set(schedule[2])  # trained, and evaluated before training again
        assert {c for c, st in states.items() if has_trained(st)} == kept
        assert bool(kept) == (per_round == 3)
        run(cfg, out, resume=True)
        ref = run(cfg, tmp_path / f"ref{per_round}")
        assert (out / "metrics.csv").read_bytes() == (ref.out_dir / "metrics.csv").read_bytes()
        assert all(has_trained(st) for st in load_checkpoint(out / "checkpoint.npz")["clients"].values())


def test_until_is_refused_where_the_paused_run_could_not_be_continued(tmp_path):
    """Without checkpoints (or on flower-sim, which cannot resume) a paused run would be lost:
    refused before the folder is touched."""
    from fedwear.api import run

    for settings in ({"checkpoint_every": 0}, {"engine": "flower-sim"}):
        with pytest.raises(FedwearError, match="until=2 pauses a run"):
            run(tiny_config(rounds=4, **settings), tmp_path / "p", until=2)
        assert not (tmp_path / "p").exists()


def test_drop_last_skips_partial_batches_and_a_too_small_client_trains_nothing(tmp_path):
    """``drop_last`` (Meta-HAR's and FedMAT's loaders): with batches larger than every client's 24
    train windows no step is taken, the weights stay as sent and the round's loss is NaN."""
    from fedwear.api import run

    big = run(tiny_config(rounds=1, batch_size=32, drop_last=True, **{"evaluation.views": "[global]"}), tmp_path / "a")
    assert np.isnan(pd.read_csv(tmp_path / "a" / "rounds.csv")["train_loss"]).all()
    untrained = run(tiny_config(rounds=1, batch_size=32, drop_last=True, local_epochs=0,
                                **{"evaluation.views": "[global]"}), tmp_path / "b")
    assert big.metrics["accuracy"].tolist() == untrained.metrics["accuracy"].tolist()
    small = run(tiny_config(rounds=1, batch_size=16, drop_last=True, **{"evaluation.views": "[global]"}), tmp_path / "c")
    keep = run(tiny_config(rounds=1, batch_size=16, **{"evaluation.views": "[global]"}), tmp_path / "d")
    assert not np.isnan(pd.read_csv(tmp_path / "c" / "rounds.csv")["train_loss"]).any()
    assert small.metrics["macro_f1"].tolist() != keep.metrics["macro_f1"].tolist()  # 24 = 16 + 8: one batch fewer


def test_in_memory_data_is_used_instead_of_the_dataset(tmp_path):
    from dataclasses import replace

    from fedwear.data import load_federated
    from fedwear.errors import FedwearError

    cfg = tiny_config()
    data = load_federated(cfg.dataset, cfg.seed)
    loaded = fedwear.run(cfg, tmp_path / "loaded")
    given = fedwear.run(cfg, tmp_path / "given", data=data)
    assert read(loaded.out_dir / "metrics.csv") == read(given.out_dir / "metrics.csv")
    first = data.clients[0]
    flipped = replace(first, test=replace(first.test, y=(first.test.y + 1) % len(data.class_names)))
    other = fedwear.run(cfg, tmp_path / "other", data=replace(data, clients=[flipped, *data.clients[1:]]))
    assert read(other.out_dir / "metrics.csv") != read(loaded.out_dir / "metrics.csv")
    with pytest.raises(FedwearError, match="in-process engine"):
        fedwear.run(tiny_config(engine="flower-sim"), tmp_path / "flower", data=data)


def test_a_diverging_run_says_so_once(tmp_path):
    """lr=1e9 turned every loss into NaN and the run ended at chance, exit 0, without a word."""
    fedwear.run(tiny_config(method="local", **{"optimizer.lr": 1e9}), tmp_path / "diverged")
    log = (tmp_path / "diverged" / "run.log").read_text()
    assert log.count("training diverged") == 1
    assert "round 1: training diverged on client(s) s01" in log and "lower optimizer.lr (now 1e+09)" in log
    fedwear.run(tiny_config(method="local"), tmp_path / "fine")
    assert "diverged" not in (tmp_path / "fine" / "run.log").read_text()
