"""Run directories: refuse, overwrite, resume, reuse; run.log; failed rounds; summary extras."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedwear
from fedwear import rundir
from fedwear.callbacks import CHECKPOINT, load_checkpoint, save_checkpoint
from fedwear.errors import FedwearError
from fedwear.methods.api import Record
from fedwear.methods.fedavg import FedAvg
from tests.helpers import tiny_config
from tests.test_run import Interrupt


def test_existing_run_is_refused_and_kept(tmp_path):
    fedwear.run(tiny_config(), tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(FedwearError, match="already holds a run of this config.*--overwrite"):
        fedwear.run(tiny_config(), tmp_path)
    with pytest.raises(FedwearError, match="a different config"):
        fedwear.run(tiny_config(seed=1), tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_overwrite_replaces_the_run(tmp_path):
    a = fedwear.run(tiny_config(), tmp_path / "a")
    fedwear.run(tiny_config(seed=1), tmp_path / "b")
    b = fedwear.run(tiny_config(), tmp_path / "b", overwrite=True)
    assert (a.out_dir / "metrics.csv").read_bytes() == (b.out_dir / "metrics.csv").read_bytes()
    assert b.summary["seed"] == 0


def test_resume_of_a_finished_run_reuses_it(tmp_path):
    first = fedwear.run(tiny_config(), tmp_path)
    stamp = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    again = fedwear.run(tiny_config(), tmp_path, resume=True)
    assert again.summary == first.summary
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == stamp  # nothing retrained


def test_resume_into_a_new_folder_starts_the_run(tmp_path):
    res = fedwear.run(tiny_config(), tmp_path / "new", resume=True)
    assert res.summary["final_round"] == 3


def test_stale_checkpoint_is_cleared_when_a_run_restarts(tmp_path):
    """A finished run, restarted with --overwrite and interrupted before its first checkpoint:
    --resume must not continue from the old run's last checkpoint."""
    cfg = tiny_config(rounds=5, checkpoint_every=4)
    fedwear.run(cfg, tmp_path)
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, tmp_path, overwrite=True, callbacks=[Interrupt(after=2)])
    assert not (tmp_path / CHECKPOINT).exists() and not (tmp_path / "summary.json").exists()
    partial = (tmp_path / "metrics.csv").read_bytes()
    with pytest.raises(FedwearError, match="no checkpoint to resume from"):
        fedwear.run(cfg, tmp_path, resume=True)
    assert (tmp_path / "metrics.csv").read_bytes() == partial  # nothing already written is lost


def test_checkpoint_of_another_run_is_refused(tmp_path):
    cfg = tiny_config(rounds=4)
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, tmp_path / "a", callbacks=[Interrupt(after=2)])
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(tiny_config(rounds=4, seed=1), tmp_path / "b", callbacks=[Interrupt(after=2)])
    (tmp_path / "a" / CHECKPOINT).write_bytes((tmp_path / "b" / CHECKPOINT).read_bytes())
    with pytest.raises(FedwearError, match="belongs to another config"):
        fedwear.run(cfg, tmp_path / "a", resume=True)


def test_checkpoint_ahead_of_the_csv_files_is_refused(tmp_path):
    cfg = tiny_config(rounds=4)
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, tmp_path, callbacks=[Interrupt(after=3)])
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    rounds[rounds["round"] <= 1].to_csv(tmp_path / "rounds.csv", index=False)
    with pytest.raises(FedwearError, match="at round 3 but rounds.csv ends at round 1"):
        fedwear.run(cfg, tmp_path, resume=True)


def test_out_naming_a_file_is_refused(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("keep")
    with pytest.raises(FedwearError, match="is a file"):
        fedwear.run(tiny_config(), target)
    assert target.read_text() == "keep"


def test_resume_keeps_early_stopping_state(tmp_path):
    cfg = tiny_config(rounds=12, **{"evaluation.patience": 2, "evaluation.best_metric": "global.accuracy",
                                    "optimizer.persist": True})
    full = fedwear.run(cfg, tmp_path / "full")
    stop = full.summary["final_round"]
    assert stop < 12
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, tmp_path / "cut", callbacks=[Interrupt(after=stop - 1)])
    resumed = fedwear.run(cfg, tmp_path / "cut", resume=True)
    assert resumed.summary["final_round"] == stop
    assert (resumed.out_dir / "metrics.csv").read_bytes() == (full.out_dir / "metrics.csv").read_bytes()


def test_run_log_tells_the_story(tmp_path):
    fedwear.run(tiny_config(), tmp_path)
    text = (tmp_path / "run.log").read_text()
    for needle in ("start: method=fedavg dataset=synthetic", "config_hash=", "data: synthetic",
                   "client s01 (train):", "(new):", "round 3/3: 3 clients", "round 3 evaluation",
                   "global acc", "end: finished"):
        assert needle in text, needle


class SilentClients(FedAvg):
    """Every reply is malformed, so no round can aggregate anything."""

    name = "silent"

    def fit(self, down, state, data, round, seed):
        up, st = super().fit(down, state, data, round, seed)
        return Record({k: np.full_like(v, np.nan) for k, v in up.arrays.items()}, up.scalars), st


def test_rounds_without_valid_replies_are_flagged(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from fedwear import cli, methods
    from fedwear.config import dump_config

    monkeypatch.setitem(methods.METHODS, "silent", SilentClients)
    res = fedwear.run(tiny_config(method="silent"), tmp_path / "api")
    assert res.summary["failed_rounds"] == [1, 2, 3]
    assert "NOT aggregated" in (tmp_path / "api" / "run.log").read_text()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(dump_config(tiny_config(method="silent")))
    out = CliRunner().invoke(cli.app, ["run", str(cfg), "--out", str(tmp_path / "cli"), "--quiet"])
    assert out.exit_code == 3
    assert "3 round(s) aggregated no valid client reply" in out.output
    ok = CliRunner().invoke(cli.app, ["run", str(cfg), "--out", str(tmp_path / "ok"), "--quiet",
                                      "--set", "method=fedavg"])
    assert ok.exit_code == 0, ok.output


def test_summary_records_library_versions(tmp_path):
    import sklearn
    import torch

    s = fedwear.run(tiny_config(), tmp_path).summary
    assert s["versions"]["torch"] == torch.__version__
    assert s["versions"]["scikit-learn"] == sklearn.__version__
    assert set(s["versions"]) >= {"python", "numpy", "flwr"}
    assert s["versions"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert s["versions"]["cpu"]
    assert json.loads((tmp_path / "summary.json").read_text())["versions"] == s["versions"]


def test_default_cache_is_the_users_cache_not_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    fedwear.run(tiny_config(**{"dataset.cache_dir": "user"}), tmp_path / "run")
    assert list((tmp_path / "xdg" / "fedwear" / "processed").glob("synthetic-*.pkl"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "xdg"]


def test_resume_on_another_cpu_is_logged(tmp_path):
    """A checkpoint keeps the libraries and CPU that wrote it; resuming elsewhere says so."""
    cfg = tiny_config(rounds=4, checkpoint_every=1)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, out, callbacks=[Interrupt(after=2)])
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, out, resume=True, callbacks=[Interrupt(after=3)])
    assert "WARNING" not in (out / "run.log").read_text()
    ckpt = load_checkpoint(out / CHECKPOINT)
    ckpt["versions"] = {**ckpt["versions"], "cpu_capability": "OTHER"}
    save_checkpoint(out / CHECKPOINT, ckpt)
    fedwear.run(cfg, out, resume=True)
    log = (out / "run.log").read_text()
    assert "WARNING resuming" in log and "cpu_capability OTHER -> " in log


def test_a_different_config_is_not_told_to_resume(tmp_path):
    fedwear.run(tiny_config(rounds=1), tmp_path)
    with pytest.raises(FedwearError, match="a run of a different config: pass --out with a new folder, or "
                                           "--overwrite") as e:
        fedwear.run(tiny_config(rounds=1, seed=3), tmp_path)
    assert "--resume" not in str(e.value)


def test_a_full_disk_at_the_marker_leaves_no_marker_and_the_next_run_starts(tmp_path, monkeypatch):
    """The marker is written first: a full disk there left an empty one, and the folder then
    passed for a run of another config."""
    import errno
    import os

    real = Path.write_text

    def full(self, *args, **kwargs):
        if self.name.startswith(rundir.MARKER):
            real(self, "")  # the file is created, then the write fails, as on a full disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *args, **kwargs)

    out = tmp_path / "run"
    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError):
        fedwear.run(tiny_config(rounds=1), out)
    monkeypatch.undo()
    assert not out.exists()  # made for this run, and left empty: removed
    fedwear.run(tiny_config(rounds=1), out)
    assert rundir.is_run(out)


def test_running_a_config_again_without_out_never_collides(tmp_path, monkeypatch):
    """The README's quickstart run twice failed: the default folder was taken. Now a second run
    gets the next number, and --resume / --overwrite act on the latest."""
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(rounds=1)
    first = fedwear.run(cfg).out_dir
    second = fedwear.run(cfg).out_dir
    assert second == first.with_name(first.name + "-2") and first.is_dir()
    assert fedwear.run(cfg, resume=True).out_dir == second  # finished: reused
    assert fedwear.run(cfg, overwrite=True).out_dir == second
    assert fedwear.run(cfg).out_dir == first.with_name(first.name + "-3")
