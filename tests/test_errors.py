"""User mistakes and a hostile file system end a command with one ``error:`` line, never a
traceback: seeds out of range, a full disk, a read-only output folder."""

from __future__ import annotations

import errno
import io
import os
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedwear.cli import app, main
from fedwear.config import dump_config, load_config
from fedwear.errors import ConfigError
from fedwear.seeding import SEED_MAX
from tests.helpers import tiny_config


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def config_file(tmp_path: Path, **overrides: object) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(dump_config(tiny_config(**overrides)))
    return path


def fedwear_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    """Exit status and stderr of ``fedwear ARGS`` through the installed entry point ``main``."""
    monkeypatch.setattr(sys, "argv", ["fedwear", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err


# ----------------------------------------------------------------------------- seeds


@pytest.mark.parametrize("key", ["seed", "dataset.seed"])
@pytest.mark.parametrize("value", [-1, SEED_MAX + 1, 2**70])
def test_seed_out_of_range_is_a_config_error(key: str, value: int) -> None:
    with pytest.raises(ConfigError, match=rf"key '{key}': Input should be"):
        load_config(data={}, overrides=[f"{key}={value}"])


def test_the_largest_seed_runs(tmp_path: Path) -> None:
    """0 .. 2**64-1 is what numpy's SeedSequence and torch.manual_seed both take."""
    from fedwear.api import run

    res = run(tiny_config(rounds=1, seed=SEED_MAX, **{"evaluation.views": "[global]"}), tmp_path / "r", quiet=True)
    assert res.summary["seed"] == SEED_MAX


def test_bad_seed_one_line_and_no_folder(tmp_path: Path) -> None:
    """A negative seed used to fail inside the run, leaving a half-made folder that blocked reruns."""
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(config_file(tmp_path)), "--set", "seed=-1", "--out", str(out)])
    assert res.exit_code == 2 and "seed" in one_error_line(res.stderr)
    assert not out.exists()


@pytest.mark.parametrize("seeds", ["0,-1", "18446744073709551616"])
def test_seeds_option_is_checked(tmp_path: Path, seeds: str) -> None:
    cfg = config_file(tmp_path)
    res = CliRunner().invoke(app, ["compare", str(cfg), "--methods", "fedavg", "--seeds", seeds,
                                   "--out", str(tmp_path / "grid")])
    line = one_error_line(res.stderr)
    assert res.exit_code == 2 and line.startswith(f"error: --seeds '{seeds}': seed ") and "2**64-1" in line
    assert not (tmp_path / "grid").exists()
    res = CliRunner().invoke(app, ["reproduce", "protohar:table2", "--seeds", seeds, "--out", str(tmp_path / "rep")])
    assert res.exit_code == 2 and one_error_line(res.stderr).startswith(f"error: --seeds '{seeds}': seed ")


# ----------------------------------------------------------------------------- the file system


class DiskFull(io.TextIOWrapper):
    """A file whose every write fails as on a full disk (``write`` raises without a file name)."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_one_line_and_nothing_deleted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    """The disk fills while round 2's rows go into metrics.csv: one line names that file, and what
    the run wrote before (config, log, round 1's rows) is still there."""
    out = tmp_path / "run"
    cfg = config_file(tmp_path, rounds=3)
    opened = {"n": 0}
    real_open = Path.open

    def open_(self: Path, mode: str = "r", *args: object, **kwargs: object):
        if self.name == "metrics.csv" and mode == "a":
            opened["n"] += 1
            if opened["n"] == 1:  # round 1 creates the file, round 2 appends
                return DiskFull(io.BufferedWriter(io.FileIO(str(self), "a")), newline="")
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", open_)
    code, err = fedwear_main(monkeypatch, capsys, "run", str(cfg), "--out", str(out), "--quiet")
    assert code == 2
    assert one_error_line(err) == (f"error: cannot write {out / 'metrics.csv'}: No space left on device "
                                   "(errno 28): free some space or pass --out with a folder on another disk")
    assert yaml.safe_load((out / "config.yaml").read_text())["rounds"] == 3
    assert (out / "run.log").stat().st_size > 0
    rounds = {line.split(",")[0] for line in (out / "metrics.csv").read_text().splitlines()[1:]}
    assert rounds == {"1"}


def test_read_only_output_folder_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture) -> None:
    """A folder the user may not write to (as root, where chmod does not stop writes, the refusal
    is simulated at mkdir)."""
    parent = tmp_path / "locked"
    parent.mkdir()
    out = parent / "run"
    if os.geteuid() == 0:
        real_mkdir = Path.mkdir

        def mkdir(self: Path, *args: object, **kwargs: object) -> None:
            if self == out:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
            real_mkdir(self, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", mkdir)
    else:
        parent.chmod(0o500)
    try:
        code, err = fedwear_main(monkeypatch, capsys, "run", str(config_file(tmp_path)), "--out", str(out), "--quiet")
    finally:
        parent.chmod(0o700)
    assert code == 2
    assert one_error_line(err) == (f"error: {out}: permission denied (Permission denied (errno 13)): "
                                   "pass --out with a writable folder")
    assert not out.exists()


def test_other_os_errors_keep_their_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSError that is not the file system's (here a missing file fedwear itself should have
    written) is a bug: it is not turned into a user error."""
    def missing() -> None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "runs/x/summary.json")

    monkeypatch.setattr("fedwear.cli.app", missing)
    with pytest.raises(FileNotFoundError):
        main()


# --- damaged files in a run folder: one line naming the file, its line or key ---------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import fedwear

    out = tmp_path_factory.mktemp("runs") / "base"
    fedwear.run(tiny_config(rounds=2), out)
    return out


def damaged(finished_run: Path, tmp_path: Path, name: str, text: str) -> Path:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    (out / name).write_text(text)
    return out


def metrics_with(finished_run: Path, column: str, value: str) -> str:
    lines = (finished_run / "metrics.csv").read_text().splitlines()
    at = lines[0].split(",").index(column)
    cells = lines[3].split(",")
    cells[at] = value
    return "\n".join([*lines[:3], ",".join(cells), *lines[4:]]) + "\n"


@pytest.mark.parametrize(("name", "edit", "says"), [
    ("metrics.csv", lambda run: metrics_with(run, "accuracy", "high"), "metrics.csv, line 4: accuracy is 'high', not a number"),
    ("metrics.csv", lambda run: metrics_with(run, "accuracy", "7.0"), "metrics.csv, line 4: accuracy is 7.0, not a possible value"),
    ("metrics.csv", lambda run: metrics_with(run, "auc", "-inf"), "metrics.csv, line 4: auc is -inf, not a possible value"),
    ("timing.csv", lambda run: "round,wall_s,cpu_s\n1,abc,1\n2,1,1\n", "timing.csv, line 2: wall_s is 'abc', not a number"),
    ("rounds.csv", lambda run: "round,bytes_down,bytes_up,train_loss\n1,x,1,0.5\n", "rounds.csv, line 2: bytes_down is 'x'"),
    ("summary.json", lambda run: '{"final": {"personalized": "x"}}', "final.personalized is 'x' (input should be a valid dictionary)"),
    ("summary.json", lambda run: '{"final": {"personalized": {"accuracy": "x"}}}', "final.personalized.accuracy is 'x'"),
    ("summary.json", lambda run: '{"final": {}, "best": []}', "best is []"),
    ("summary.json", lambda run: '{"final": {}, "final_stats": "x"}', "final_stats is 'x'"),
    ("summary.json", lambda run: '{"final": {}, "wall_time_s": "x"}', "wall_time_s is 'x'"),
    ("summary.json", lambda run: '{"final": {}, "bytes_up": "x"}', "bytes_up is 'x'"),
    ("summary.json", lambda run: '{"final": {}, "config_hash": 5}', "config_hash is 5"),
    ("summary.json", lambda run: '{"final": {}, "failed_rounds": "x"}', "failed_rounds is 'x'"),
    ("summary.json", lambda run: '{"final": {}, "n_clients": "x"}', "n_clients is 'x'"),
    ("summary.json", lambda run: '[]', "has no 'final' results"),
])
def test_a_damaged_run_file_is_one_line_for_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture, finished_run: Path, name, edit,
                                                       says) -> None:
    out = damaged(finished_run, tmp_path, name, edit(finished_run))
    code, err = fedwear_main(monkeypatch, capsys, "report", str(out))
    assert code == 2 and str(out / name) in one_error_line(err) and says in err, err


def test_a_run_whose_every_metric_is_nan_still_gets_its_report(tmp_path: Path, finished_run: Path) -> None:
    """NaN is what a run that reported no number writes (a diverged model): not an error, but no
    curve to draw (the legend of an empty figure was a numpy traceback)."""
    import pandas as pd

    from fedwear.report.build import write_report

    metrics = pd.read_csv(finished_run / "metrics.csv")
    metrics[["accuracy", "macro_f1", "auc"]] = float("nan")
    out = damaged(finished_run, tmp_path, "metrics.csv", metrics.to_csv(index=False))
    assert write_report(out).is_file()
    assert not (out / "report" / "curves.png").exists()
