"""``fedwear tune``: Optuna on the validation split only, pruning, shared studies, --best."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from fedwear.cli import app
from fedwear.config import load_config
from fedwear.data import load_federated
from fedwear.errors import ConfigError
from tests.conftest import needs_extra

pytestmark = pytest.mark.extra("tune")
needs_extra("tune")
import optuna  # noqa: E402

from fedwear import tune  # noqa: E402

CONFIG = {
    "method": "fedavg", "rounds": 3, "clients_per_round": 3, "local_epochs": 1, "batch_size": 8, "threads": 1,
    "dataset": {"name": "synthetic", "window": 32, "held_out": 2, "cache_dir": None, "val_fraction": 0.3,
                "synthetic": {"num_subjects": 8, "num_classes": 3, "seconds_per_class": 8}},
    "model": {"name": "cnn", "options": {"width": 8}},
    "optimizer": {"lr": 0.001},  # too small to learn anything in 3 rounds: tuning has room
    "evaluation": {"adapt_epochs": 1},
}
SPACE = {"optimizer.lr": {"low": 0.001, "high": 0.5, "log": True}}


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    cfg, space = tmp_path / "cfg.yaml", tmp_path / "space.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    space.write_text(yaml.safe_dump(SPACE))
    return cfg, space


def trials_of(study) -> list[tuple]:
    return [(t.number, t.state.name, t.params, t.value) for t in study.trials]


def test_the_tuned_learning_rate_beats_the_default_on_validation(files, tmp_path: Path) -> None:
    cfg, space = files
    study = tune.search(cfg, space, 5, tmp_path / "study")
    first = study.trials[0]
    assert first.params == {"optimizer.lr": 0.001}  # the config's own value is the first trial
    assert first.state.name == "COMPLETE" and study.best_value > first.value
    assert study.best_params["optimizer.lr"] > 0.01
    assert len(study.trials) == 5 and (tmp_path / "study" / tune.JOURNAL).is_file()
    again = tune.search(cfg, space, 5, tmp_path / "study")  # the study holds 5 already: nothing more runs
    assert len(again.trials) == 5


def test_test_labels_never_enter_the_objective(files, tmp_path: Path) -> None:
    cfg_file, space = files
    cfg = load_config(cfg_file)
    data = load_federated(cfg.dataset, cfg.seed)
    rng = np.random.default_rng(0)

    def scrambled(c):
        return dataclasses.replace(c, test=dataclasses.replace(c.test, y=rng.permutation(c.test.y)))

    other = dataclasses.replace(data, clients=[scrambled(c) for c in data.clients],
                                new_clients=[scrambled(c) for c in data.new_clients])
    assert any((a.test.y != b.test.y).any() for a, b in zip(data.clients, other.clients, strict=True))
    plain = tune.search(cfg_file, space, 4, tmp_path / "a", data=data)
    blind = tune.search(cfg_file, space, 4, tmp_path / "b", data=other)
    assert trials_of(plain) == trials_of(blind)
    # the test split was scored in both (metrics.csv), and differently: it just never counted
    a = (tmp_path / "a" / "trial-0001" / "metrics.csv").read_text()
    b = (tmp_path / "b" / "trial-0001" / "metrics.csv").read_text()
    assert a != b


def test_no_validation_split_is_refused_in_one_line(files) -> None:
    cfg, space = files
    res = CliRunner().invoke(app, ["tune", str(cfg), "--space", str(space), "--set", "dataset.val_fraction=0"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "optimises the validation split" in res.stderr and "tuning on the test split is refused" in res.stderr


@pytest.mark.parametrize("spec, needle", [
    ({"evaluation.best_split": {"choices": ["test"]}}, "cannot be searched"),
    ({"optimizer.lr": {"low": 0.5, "high": 0.1}}, "must be below high"),
    ({"optimizer.lr": {"low": 0.1}}, "give low and high"),
    ({"optimizer.lrr": {"low": 0.1, "high": 0.5}}, "unknown key 'optimizer.lrr'"),
    ({"optimizer.lr": {"low": 0, "high": 0.5}}, "key 'optimizer.lr': Input should be greater than 0"),
])
def test_a_bad_space_is_one_line(files, tmp_path: Path, spec, needle) -> None:
    """Each mistake names the space file (never a --set the user did not type) and the key."""
    cfg, space = files
    space.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(space))}: .*{needle}"):
        tune.search(cfg, space, 1, tmp_path / "s")
    assert not list((tmp_path / "s").glob("trial-*"))


def test_a_diverging_trial_is_pruned_and_recorded(files, tmp_path: Path) -> None:
    cfg, space = files
    space.write_text(yaml.safe_dump({"optimizer.lr": {"low": 1e8, "high": 1e9, "log": True}}))
    study = tune.search(cfg, space, 2, tmp_path / "s")
    assert [t.state.name for t in study.trials] == ["PRUNED", "PRUNED"]
    assert all(t.user_attrs["pruned_because"].startswith("diverged") for t in study.trials)


def test_best_runs_the_tuned_and_the_default_config_on_the_test_split(files, tmp_path: Path) -> None:
    cfg, space = files
    out = tmp_path / "study"
    res = CliRunner().invoke(app, ["tune", str(cfg), "--space", str(space), "--trials", "3", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["tune", str(cfg), "--space", str(space), "--out", str(out), "--best",
                                   "--seeds", "0", "--quiet"])
    assert res.exit_code == 0, res.output
    table = (out / "best" / "table.md").read_text()
    assert "| fedavg |" in table and "| fedavg-tuned |" in table and "(a value without ± is one seed's)" in table
    assert sorted(p.name for p in (out / "best").iterdir() if p.is_dir()) == ["fedavg-s0", "fedavg-tuned-s0"]


@pytest.mark.slow
def test_two_worker_processes_share_one_study(files, tmp_path: Path) -> None:
    cfg, space = files
    out = tmp_path / "shared"
    cmd = [sys.executable, "-m", "fedwear.cli", "tune", str(cfg), "--space", str(space), "--trials", "6",
           "--out", str(out), "--quiet"]
    workers = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}) for _ in range(2)]
    for w in workers:
        _, err = w.communicate(timeout=600)
        assert w.returncode == 0, err
    study = optuna.load_study(study_name="cfg", storage=tune.storage_of(out, None))
    done = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(done) >= 6 and len({t.number for t in study.trials}) == len(study.trials)
    assert len({t.user_attrs["worker"] for t in done}) == 2  # both processes ran trials
    assert sorted(p.name for p in out.glob("trial-*")) == [f"trial-{t.number:04d}" for t in study.trials]


@pytest.mark.parametrize(("damage", "says"), [
    (lambda b: b + b"this is not json\n", "ValueError: line "),
    (lambda b: b"\x00\xff\xfe" * 100, "UnicodeDecodeError"),
    (lambda b: b + b'{"op_code": 99, "worker_id": "x"}\n', "AssertionError"),
])
def test_a_damaged_journal_is_one_line_and_kept(files, tmp_path: Path, damage, says) -> None:
    cfg, space = files
    out = tmp_path / "study"
    tune.search(cfg, space, 1, out)
    journal = out / tune.JOURNAL
    journal.write_bytes(damage(journal.read_bytes()))
    before = journal.read_bytes()
    res = CliRunner().invoke(app, ["tune", str(cfg), "--space", str(space), "--trials", "2", "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert f"{journal}: not a readable Optuna journal ({says}" in res.output and "move it away" in res.output
    if says == "ValueError: line ":  # the garbage line, after the study's own records
        assert f"line {len(before.splitlines())}: Expecting value" in res.output
    assert journal.read_bytes() == before


def test_a_journal_torn_by_a_kill_loses_only_its_last_record(files, tmp_path: Path, caplog) -> None:
    cfg, space = files
    out = tmp_path / "study"
    tune.search(cfg, space, 2, out)
    journal = out / tune.JOURNAL
    whole = journal.read_bytes()
    last = whole.rstrip(b"\n").rfind(b"\n") + 1
    journal.write_bytes(whole[: last + (len(whole) - last) // 2])  # the last record cut in half
    with caplog.at_level("WARNING", logger="fedwear"):
        study = tune.search(cfg, space, 3, out)
    assert "dropped a torn last record" in caplog.text
    assert len(study.trials) >= 3 and journal.read_bytes().startswith(whole[:last])
