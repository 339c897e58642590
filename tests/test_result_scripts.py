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
