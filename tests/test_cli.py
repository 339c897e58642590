"""The command line: user mistakes end with one clear line, exit code 2, no traceback."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedwear import rundir
from fedwear.config import dump_config
from tests.helpers import tiny_config

ROOT = Path(__file__).resolve().parents[1]


def fedwear(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedwear.cli", *args], capture_output=True, text=True, cwd=cwd)


def assert_one_line_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n in lines[0]


@pytest.fixture
def cfg_file(tmp_path) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(dump_config(tiny_config()))
    return p


@pytest.mark.slow
def test_run_prints_summary_and_writes_run_dir(cfg_file, tmp_path):
    res = fedwear("run", str(cfg_file), "--out", str(tmp_path / "run"), "--quiet")
    assert res.returncode == 0, res.stderr
    assert "| personalized |" in res.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["final_round"] == 3


@pytest.mark.slow
def test_unknown_method(cfg_file):
    assert_one_line_error(fedwear("run", str(cfg_file), "--set", "method=fedfoo"), "unknown method 'fedfoo'",
                          "fedwear methods")
    assert_one_line_error(fedwear("run", str(cfg_file), "--set", "method=fedavgg"), "did you mean fedavg")


@pytest.mark.slow
def test_unknown_key(cfg_file):
    assert_one_line_error(fedwear("run", str(cfg_file), "--set", "dataset.rooot=x"), "dataset.rooot")


@pytest.mark.slow
def test_unknown_method_option(cfg_file):
    res = fedwear("run", str(cfg_file), "--set", "method=fedprox", "--set", "method_options.fedprox.muu=1")
    assert_one_line_error(res, "method_options.fedprox.muu")


@pytest.mark.slow
def test_missing_config_file(tmp_path):
    assert_one_line_error(fedwear("run", str(tmp_path / "none.yaml")), "none.yaml")


@pytest.mark.slow
def test_missing_data_root(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(dump_config(tiny_config(**{"dataset.name": "usc_had", "dataset.root": str(tmp_path / "nope")})))
    assert_one_line_error(fedwear("run", str(cfg), "--out", str(tmp_path / "run")), "nope", "dataset.root")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_corrupt_mat_file_keeps_existing_outputs(tmp_path, data_root):
    root = tmp_path / "usc"
    (root / "Subject1").mkdir(parents=True)
    shutil.copy(data_root / "usc_had" / "Subject1" / "a1t1.mat", root / "Subject1" / "a1t1.mat")
    (root / "Subject1" / "a2t1.mat").write_bytes(b"MATLAB 5.0 MAT-file garbage" + bytes(100))
    out = tmp_path / "run"
    out.mkdir()
    rundir.write_marker(out)  # a previous run's folder, which --overwrite would replace
    (out / "metrics.csv").write_text("previous run")
    (out / "notes.txt").write_text("keep me")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    cfg = tmp_path / "c.yaml"
    cfg.write_text(dump_config(tiny_config(**{"dataset.name": "usc_had", "dataset.root": str(root)})))
    assert_one_line_error(fedwear("run", str(cfg), "--out", str(out), "--overwrite"), "a2t1.mat")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.slow
def test_nan_in_signal(tmp_path, hapt_root):
    root = tmp_path / "hapt" / "RawData"
    root.mkdir(parents=True)
    src = hapt_root / "RawData"
    import numpy as np

    acc = np.loadtxt(src / "acc_exp01_user01.txt.gz")
    acc[100, 1] = np.nan
    np.savetxt(root / "acc_exp01_user01.txt", acc)
    shutil.copy(src / "gyro_exp01_user01.txt.gz", root)
    lines = [ln for ln in (src / "labels.txt").read_text().splitlines() if ln.split()[0] == "1"]
    (root / "labels.txt").write_text("\n".join(lines) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(dump_config(tiny_config(**{"dataset.name": "uci_hapt", "dataset.root": str(tmp_path / "hapt")})))
    assert_one_line_error(fedwear("run", str(cfg)), "acc_exp01_user01")


@pytest.mark.slow
def test_other_config_in_run_dir_is_refused(cfg_file, tmp_path):
    out = tmp_path / "run"
    assert fedwear("run", str(cfg_file), "--out", str(out), "--quiet").returncode == 0
    before = (out / "metrics.csv").read_bytes()
    res = fedwear("run", str(cfg_file), "--out", str(out), "--set", "seed=5", "--quiet")
    assert_one_line_error(res, "different config")
    assert (out / "metrics.csv").read_bytes() == before


@pytest.mark.slow
def test_model_too_deep_for_the_window(cfg_file, tmp_path):
    res = fedwear("run", str(cfg_file), "--set", "model.name=harcnn", "--set", "model.options={}",
                  "--out", str(tmp_path / "r"))
    assert_one_line_error(res, "model.name=harcnn cannot take windows of 32 samples", "dataset.window")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_out_naming_an_existing_file(cfg_file, tmp_path):
    (tmp_path / "f").write_text("keep")
    assert_one_line_error(fedwear("run", str(cfg_file), "--out", str(tmp_path / "f")), "is a file")
    assert (tmp_path / "f").read_text() == "keep"


@pytest.mark.slow
def test_seeds_that_are_not_integers(cfg_file, tmp_path):
    res = fedwear("compare", str(cfg_file), "--methods", "fedavg", "--seeds", "0,x", "--out", str(tmp_path / "c"))
    assert_one_line_error(res, "--seeds", "'0,x'")


@pytest.mark.slow
def test_existing_run_needs_resume_or_overwrite(cfg_file, tmp_path):
    out = tmp_path / "run"
    assert fedwear("run", str(cfg_file), "--out", str(out), "--quiet").returncode == 0
    assert_one_line_error(fedwear("run", str(cfg_file), "--out", str(out), "--quiet"), "--resume", "--overwrite")
    res = fedwear("run", str(cfg_file), "--out", str(out), "--quiet", "--overwrite", "--set", "seed=4")
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "summary.json").read_text())["seed"] == 4


@pytest.mark.slow
def test_methods_and_data_list():
    res = fedwear("methods")
    assert res.returncode == 0 and "fedprox.mu" in res.stdout and "centralized" in res.stdout
    res = fedwear("data", "list")
    assert res.returncode == 0 and "usc_had" in res.stdout and "uci_hapt" in res.stdout


@pytest.mark.slow
def test_data_info(data_root):
    res = fedwear("data", "info", "usc_had", "--root", str(data_root / "usc_had"))
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["subjects"] == 14 and info["recordings"] == 840
    res = fedwear("data", "info", "usc-had")
    assert res.returncode == 2 and res.stderr.startswith("error: unknown dataset 'usc-had'; known: ")


@pytest.mark.slow
def test_compare_writes_table(cfg_file, tmp_path):
    res = fedwear("compare", str(cfg_file), "--methods", "fedavg,local", "--seeds", "0,1",
                  "--out", str(tmp_path / "cmp"), "--quiet")
    assert res.returncode == 0, res.stderr
    md = (tmp_path / "cmp" / "table.md").read_text()
    assert "| fedavg |" in md and "| local |" in md and "±" in md
    assert (tmp_path / "cmp" / "table.csv").exists()
    assert (tmp_path / "cmp" / "local-s1" / "summary.json").exists()


@pytest.mark.slow
def test_compare_reuses_finished_runs_and_resumes_unfinished_ones(cfg_file, tmp_path):
    root = tmp_path / "cmp"
    args = ["compare", str(cfg_file), "--methods", "fedavg,local", "--seeds", "0", "--out", str(root), "--quiet"]
    assert fedwear(*args).returncode == 0
    table = (root / "table.md").read_text()
    finished = (root / "fedavg-s0" / "timing.csv").stat().st_mtime_ns
    # local's run interrupted after round 2, as a kill would leave it
    from fedwear.api import run
    from fedwear.config import load_config
    from tests.test_run import Interrupt

    cut = root / "local-s0"
    with pytest.raises(KeyboardInterrupt):
        run(load_config(cfg_file, ["method=local", "seed=0"]), cut, overwrite=True, callbacks=[Interrupt(2)])
    assert not (cut / "summary.json").exists()
    res = fedwear(*args)
    assert res.returncode == 0, res.stderr
    assert (root / "fedavg-s0" / "timing.csv").stat().st_mtime_ns == finished  # reused, not retrained
    assert "resume after round" in (cut / "run.log").read_text()
    assert (root / "table.md").read_text() == table


@pytest.mark.slow
def test_compare_in_parallel_equals_serial(cfg_file, tmp_path):
    base = ["compare", str(cfg_file), "--methods", "fedavg,local", "--seeds", "0,1", "--quiet"]
    assert fedwear(*base, "--out", str(tmp_path / "serial")).returncode == 0
    res = fedwear(*base[:-1], "--out", str(tmp_path / "par"), "--jobs", "2")  # with the workers' progress
    assert res.returncode == 0, res.stderr
    for run in ("fedavg-s0", "fedavg-s1", "local-s0", "local-s1"):  # plain lines, named by run folder
        assert f"\n{run}: {run.split('-')[0]} on synthetic: round 3/3, " in res.stderr, res.stderr
    status = [tuple(map(int, m)) for m in re.findall(r"\[(\d)/4 done, (\d) running, (\d) queued\]", res.stderr)]
    assert [s[0] for s in status] == [1, 2, 3, 4] and all(sum(s) == 4 and s[1] <= 2 for s in status), res.stderr
    assert status[-1] == (4, 0, 0)
    for run in ("fedavg-s0", "local-s1"):
        a = (tmp_path / "serial" / run / "metrics.csv").read_bytes()
        assert a == (tmp_path / "par" / run / "metrics.csv").read_bytes()


def test_a_grid_counts_as_running_the_folders_locked_since_it_started(tmp_path):
    import os

    from fedwear.compare import GridStatus, writing
    from fedwear.rundir import LOCK

    for name, age in (("now", 0), ("stale", 3600)):  # a lock left by a run killed an hour ago
        (tmp_path / name).mkdir()
        (tmp_path / name / LOCK).write_text("fedwear (pid 1)")
        os.utime(tmp_path / name / LOCK, (time.time() - age,) * 2)
    (tmp_path / "queued").mkdir()
    since = time.time() - 60
    assert writing([tmp_path / "now", tmp_path / "stale", tmp_path / "queued", tmp_path / "absent"], since) == 1
    assert str(GridStatus(2, 1, 3)) == "2/6 done, 1 running, 3 queued"


@pytest.mark.slow
def test_flower_serve_refuses_a_folder_holding_a_run(cfg_file, tmp_path):
    out = tmp_path / "run"
    assert fedwear("run", str(cfg_file), "--out", str(out), "--quiet").returncode == 0
    res = fedwear("flower", "serve", str(cfg_file), "--out", str(out), "--nodes", "1", "--insecure",
                  "--superlink", "127.0.0.1:9")
    assert_one_line_error(res, "already holds a run", "--overwrite")


def _commands(group, path=()):
    """Every leaf command of the CLI with its path, e.g. (("data", "list"), <command>)."""

    for name, cmd in group.commands.items():
        if getattr(cmd, "commands", None) is not None:  # a group (click's, or typer's own copy of it)
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_help_reads_in_an_80_column_terminal():
    """`fedwear --help` groups the commands, run first; each command's help is whole paragraphs
    (no source line breaks to wrap raggedly), and an off-by-default switch is one flag
    (`--quiet`, not `--quiet / --no-quiet`, which halved the description column)."""
    import typer.main
    from typer.testing import CliRunner

    from fedwear.cli import app

    listing = CliRunner().invoke(app, ["--help"], terminal_width=80).output
    panels = re.findall(r"╭─ (.+?) ─", listing)
    assert panels == ["Options", "Experiments", "Data, methods and configs", "Deployment"], listing
    listed = re.findall(r"^│ ([a-z][a-z-]*) ", listing, re.M)
    assert listed[:3] == ["run", "compare", "reproduce"], listed
    group = typer.main.get_command(app)
    assert set(listed) == set(group.commands), listed
    for path, cmd in _commands(group):
        for paragraph in (cmd.help or "").split("\n\n"):
            assert "\n" not in paragraph, (path, paragraph)
        for param in cmd.params:
            if getattr(param, "is_flag", False) and param.default is False:
                assert not param.secondary_opts, (path, param.opts, param.secondary_opts)


def test_version_names_what_the_numbers_depend_on():
    from fedwear.version import __version__, library_versions

    res = fedwear("--version")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"fedwear {__version__}"
    assert [ln.split(":")[0].strip() for ln in lines[1:]] == list(library_versions())


@pytest.mark.slow
def test_methods_shows_the_named_ones_one_line_each_when_piped_wrapped_in_a_terminal():
    from fedwear.methods import METHODS

    piped = fedwear("methods", "fedali", "fedprox")
    assert piped.returncode == 0, piped.stderr
    heads = [ln.split()[0] for ln in piped.stdout.splitlines() if not ln.startswith(" ")]
    assert heads == ["fedali", "fedprox"]
    options = [ln.split()[0] for ln in piped.stdout.splitlines() if ln.startswith(" ")]
    assert options == [f"{m}.{o}" for m in heads for o in METHODS[m].Options.model_fields]
    assert_one_line_error(fedwear("methods", "fedal"), "fedwear methods: unknown method 'fedal'", "fedali")

    import os
    import pty  # a terminal 60 columns wide: the same text, wrapped under its name

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "fedwear.cli", "methods", "fedali"], stdout=follower,
                            env={**os.environ, "COLUMNS": "60"})
    os.close(follower)
    out = b""
    while True:  # read as it comes: a full terminal buffer would block the command
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the command has ended and closed its side: everything is read
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    lines = out.decode().replace("\r\n", "\n").splitlines()
    assert max(map(len, lines)) <= 60 and len(lines) > len(piped.stdout.splitlines()) / 2
    assert " ".join(" ".join(lines).split()) == " ".join(fedwear("methods", "fedali").stdout.split())
