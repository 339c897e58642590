"""Progress inside a round: each client's reply reaches the callbacks as it arrives."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

import fedwear
from fedwear.callbacks import RunLog
from fedwear.engines.runner import Callback
from tests.helpers import tiny_config


class Replies(Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str]] = []

    def on_round_start(self, runner, round, clients):
        self.seen.append(("start", round, ",".join(clients)))

    def on_reply(self, runner, round, client):
        self.seen.append(("reply", round, client))


@pytest.mark.parametrize("engine", ["sim", "batched"])
def test_every_client_of_every_round_is_reported_once_after_the_round_starts(tmp_path: Path, engine: str) -> None:
    cb = Replies()
    fedwear.run(tiny_config(rounds=2, engine=engine, **{"evaluation.views": "[global]"}), tmp_path / "r",
                quiet=True, callbacks=[cb])
    rounds = pd.read_csv(tmp_path / "r" / "rounds.csv")
    assert [(kind, r) for kind, r, _ in cb.seen] == [("start", 1), *[("reply", 1)] * 3, ("start", 2), *[("reply", 2)] * 3]
    for r, clients in zip(rounds["round"], rounds["clients"], strict=True):
        started = [ids for kind, rr, ids in cb.seen if kind == "start" and rr == r]
        replied = [c for kind, rr, c in cb.seen if kind == "reply" and rr == r]
        assert sorted(started[0].split(",")) == sorted(replied) == sorted(clients.split(";"))


class Steps(Callback):
    """Each client's optimiser steps, checked against its epochs x batches when its reply arrives."""

    def __init__(self) -> None:
        self.steps: dict[str, int] = {}
        self.checked: list[tuple[str, int, int]] = []

    def on_step(self, runner, round, client, step, planned):
        self.steps[client] = self.steps.get(client, 0) + 1
        assert step == self.steps[client] <= planned  # one training loop per FedAvg fit

    def on_reply(self, runner, round, client):
        n = len(runner.executor.trainers[client].data.train)
        want = runner.cfg.local_epochs * math.ceil(n / runner.cfg.batch_size)
        self.checked.append((client, self.steps.pop(client, 0), want))


def test_each_optimiser_step_of_a_client_is_reported_before_its_reply(tmp_path: Path) -> None:
    cb = Steps()
    fedwear.run(tiny_config(rounds=2, **{"evaluation.views": "[global]"}), tmp_path / "r", quiet=True, callbacks=[cb])
    assert len(cb.checked) == 6 and all(got == want > 0 for _, got, want in cb.checked)
    assert not cb.steps  # no step after a client's reply


def test_a_slow_round_logs_each_reply_with_the_time_so_far(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RunLog, "SLOW_ROUND_S", 0.0)
    fedwear.run(tiny_config(rounds=1, **{"evaluation.views": "[global]"}), tmp_path / "r", quiet=True)
    lines = [ln for ln in (tmp_path / "r" / "run.log").read_text().splitlines() if "s into the round" in ln]
    assert [ln.split("INFO ")[1].split(",")[0] for ln in lines] == [
        f"round 1/1: client {c} done" for c in pd.read_csv(tmp_path / "r" / "rounds.csv")["clients"][0].split(";")]
    assert lines[-1].split(", ")[1] == "3 of 3"


def test_a_fast_round_logs_no_reply_lines(tmp_path: Path) -> None:
    fedwear.run(tiny_config(rounds=1, **{"evaluation.views": "[global]"}), tmp_path / "r", quiet=True)
    assert "s into the round" not in (tmp_path / "r" / "run.log").read_text()


def test_the_progress_bar_shows_the_round_time(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fedwear.run(tiny_config(rounds=2, **{"evaluation.views": "[global]"}), tmp_path / "r", quiet=False)
    out = capsys.readouterr()
    assert "s/round" in out.out + out.err


def plain_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("fedavg on synthetic: round ")]


def test_without_a_terminal_progress_is_plain_lines_on_stderr(tmp_path: Path, capsys, monkeypatch) -> None:
    """Output to a file (pytest's capture here, ``nohup`` for a user): no bar drawn once at the
    end and cut to 80 columns, but whole lines, for the first and the last round and, when they
    are far enough apart, the rounds and clients in between."""
    from fedwear.callbacks import Progress

    monkeypatch.setattr(Progress, "PLAIN_EVERY_S", 1e9)
    fedwear.run(tiny_config(rounds=4), tmp_path / "a", quiet=False)
    out = capsys.readouterr()
    lines = plain_lines(out.err)
    assert [line.split(",")[0] for line in lines] == ["fedavg on synthetic: round 1/4", "fedavg on synthetic: round 4/4"]
    assert all(" elapsed, eta " in line and "s/round | pers. acc" in line for line in lines), lines
    assert "eta 0:00:00" in lines[-1] and "…" not in out.err and out.out == ""

    monkeypatch.setattr(Progress, "PLAIN_EVERY_S", 0.0)
    fedwear.run(tiny_config(rounds=4), tmp_path / "b", quiet=False)
    lines = plain_lines(capsys.readouterr().err)
    assert [line.split(",")[0] for line in lines if "/4" in line] == [f"fedavg on synthetic: round {r}/4" for r in (1, 2, 3, 4)]
    assert "fedavg on synthetic: round 2: 3 of 3 clients done" in lines


def test_each_plain_line_is_one_write(tmp_path: Path, monkeypatch) -> None:
    """The runs of ``compare --jobs N`` share one stderr: a line written in two pieces (text, then
    its newline) lets another run's line in between, so each line goes out whole, in one write."""
    import io
    import sys

    writes: list[str] = []

    class Recorder(io.StringIO):
        def write(self, s: str) -> int:
            writes.append(s)
            return len(s)

    monkeypatch.setattr(sys, "stderr", Recorder())
    fedwear.run(tiny_config(rounds=2), tmp_path / "r", quiet=False)
    lines = [w for w in writes if w.startswith("fedavg on synthetic: round ")]
    assert len(lines) == 2 and all(w.endswith("\n") and w.count("\n") == 1 for w in lines), writes
    assert "\n" not in writes, "a newline written on its own"
