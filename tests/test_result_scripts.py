"""The scripts that results/*.md cite: their numbers on hand-made run folders, their errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True
    )


def write_metrics(run: Path, rows: list[tuple]) -> None:
    run.mkdir(parents=True)
    lines = ["round,client,view,split,n,accuracy"] + [",".join(map(str, r)) for r in rows]
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_eval_rounds_weights_clients_by_test_windows(tmp_path):
    write_metrics(
        tmp_path / "r",
        [
            (10, 0, "new_clients@e2", "test", 10, 1.0),
            (10, 1, "new_clients@e2", "test", 30, 0.5),  # (10 + 15) / 40
            (10, 0, "new_clients@e2", "train", 100, 0.0),  # not a test row
            (20, 0, "new_clients@e2", "test", 10, 0.25),
            (20, 0, "personalized@e2", "test", 10, 0.75),
        ],
    )
    out = run_script(
        "eval_rounds.py", str(tmp_path / "r"), "--views", "new_clients@e2,personalized@e2"
    )
    assert out.returncode == 0, out.stderr
    assert "| 10 | 62.50 | - |" in out.stdout
    assert "| 20 | 25.00 | 75.00 |" in out.stdout


@pytest.mark.slow
def test_eval_rounds_names_a_missing_folder(tmp_path):
    out = run_script("eval_rounds.py", str(tmp_path / "nope"), "--views", "x")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'nope' / 'metrics.csv'}: missing "
        f"(is {tmp_path / 'nope'} a run folder?)"
    ]


@pytest.mark.parametrize(
    "seeds, expected",
    [("0,1", "meta-train 70.00, meta-test 40.00"), ("1", "meta-train 80.00, meta-test 60.00")],
)
def test_seed_means_averages_exactly_the_seeds_given(tmp_path, seeds, expected):
    for seed, (train, test) in enumerate([(0.6, 0.2), (0.8, 0.6), (0.0, 0.0)]):
        run = tmp_path / f"m-s{seed}"
        run.mkdir()
        final = {"personalized@n3": {"accuracy": train}, "new_clients@n3": {"accuracy": test}}
        (run / "summary.json").write_text(json.dumps({"final": final}))
    out = run_script("seed_means.py", str(tmp_path), "--seeds", seeds, "m@n3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"m@n3: {expected} (seeds {seeds})"


def test_seed_means_names_an_unfinished_run(tmp_path):
    out = run_script("seed_means.py", str(tmp_path), "--seeds", "0", "m")
    assert out.returncode != 0
    assert "m-s0/summary.json: missing" in out.stderr


@pytest.mark.slow
def test_claim_breakdown_shows_a_verdict_by_seed_and_client():
    out = run_script("claim_breakdown.py", "fedmat-beats-ablations")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("fedmat-beats-ablations: ")
    assert "fedmat@e4 vs fedmat-no_sensor@e4: effect" in out.stdout and "seed means: s0 " in out.stdout
    assert "clients: " in out.stdout and "of 14" in out.stdout  # 9 users at all 5 seeds are tested, 14 shown
    bad = run_script("claim_breakdown.py", "no-such-claim")
    assert bad.returncode == 2 and "error: no claim 'no-such-claim'" in bad.stderr
