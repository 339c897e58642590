"""The claims ledger (``fedwear reproduce --claims``) and the paired tests of ``fedwear compare``."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from fedwear.cli import app
from fedwear.config import dump_config
from fedwear.errors import ConfigError
from fedwear.reproduce import EXPERIMENTS, Experiment, plan
from fedwear.reproduce import claims as cl
from tests.helpers import tiny_config

CLIENTS = ("c1", "c2", "c3", "c4", "c5", "c6")


def _table(tmp_path: Path) -> Experiment:
    """A table of two methods x 3 seeds on a tiny config, its runs in ``tmp_path/runs/tiny``."""
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_config()))
    return Experiment(key="tiny:table", title="tiny", config=str(config), methods=("fedavg", "local"),
                      seeds=(0, 1, 2), folder="tiny", results="tiny.md")


def _write_runs(exp: Experiment, runs_root: Path, accuracy: dict[str, float],
                clients: tuple[str, ...] = CLIENTS) -> None:
    """Run folders of ``exp`` whose metrics.csv give each client ``accuracy[method]`` plus a
    per-(seed, client) offset, at rounds 0 and 3 (round 3 the best)."""
    for method, cfg, where in plan(exp, runs_root / "tiny", None):
        where.mkdir(parents=True, exist_ok=True)
        (where / "config.yaml").write_text(dump_config(cfg))
        rows = ["round,client,view,split,n,n_train,accuracy,macro_f1,auc"]
        for k, client in enumerate(clients):
            acc = accuracy[method] + 0.01 * k + 0.005 * cfg.seed
            rows += [f"0,{client},personalized,test,10,20,0.1,0.1,0.5",
                     f"3,{client},personalized,test,10,20,{acc},{acc - 0.1},0.9"]
        (where / "metrics.csv").write_text("\n".join(rows) + "\n")
        (where / "rounds.csv").write_text("round\n" + "".join(f"{r}\n" for r in range(1, cfg.rounds + 1)))


CLAIM = cl.Claim(id="tiny-claim", statement="FedAvg beats Local", source="nowhere, Table 0", view="personalized",
                 metric="accuracy", comparisons=(("fedavg", "local"),), experiment="tiny:table")


def _verdict(exp: Experiment, tmp_path: Path, claim: cl.Claim = CLAIM) -> cl.Outcome:
    return cl.evaluate(claim, tmp_path / "runs", tmp_path, tmp_path / "data", {exp.key: exp})


def test_a_verdict_follows_the_numbers_and_flips_when_the_runs_are_swapped(tmp_path):
    exp = _table(tmp_path)
    _write_runs(exp, tmp_path / "runs", {"fedavg": 0.8, "local": 0.6})
    got = _verdict(exp, tmp_path)
    assert got.verdict == cl.HOLDS
    (_, _, test), = got.tests
    assert test.n == 6 and test.effect == pytest.approx(20.0) and test.low > 0 and test.p < 0.05  # 6 clients
    assert got.runs == {"fedavg": "s0 (3/3), s1 (3/3), s2 (3/3)", "local": "s0 (3/3), s1 (3/3), s2 (3/3)"}
    assert got.line.startswith("stops: the verdict is clear at this budget (holds)")
    runs = tmp_path / "runs" / "tiny"
    for seed in (0, 1, 2):  # the two methods' numbers swapped
        a, b = runs / f"fedavg-s{seed}" / "metrics.csv", runs / f"local-s{seed}" / "metrics.csv"
        held = a.read_text()
        shutil.copy(b, a)
        b.write_text(held)
    flipped = _verdict(exp, tmp_path)
    assert flipped.verdict == cl.FAILS
    assert flipped.tests[0][2].effect == pytest.approx(-20.0) and flipped.tests[0][2].high < 0


def test_a_run_short_of_its_rounds_decides_nothing(tmp_path):
    """A run stopped early (or still going) is of a smaller budget: it is left out where its method
    has finished seeds, and where it has none, a clear difference is still no verdict."""
    exp = _table(tmp_path)
    _write_runs(exp, tmp_path / "runs", {"fedavg": 0.8, "local": 0.6})
    (tmp_path / "runs" / "tiny" / "local-s1" / "rounds.csv").write_text("round\n1\n")
    got = _verdict(exp, tmp_path)
    assert got.verdict == cl.HOLDS and got.tests[0][2].n == 6  # over seeds 0 and 2: local's s1 left out
    assert "left out, short of their planned rounds: local s1" in got.reason
    assert got.runs["local"] == "s0 (3/3), s1 (1/3), s2 (3/3)"
    for seed in (0, 2):
        (tmp_path / "runs" / "tiny" / f"local-s{seed}" / "rounds.csv").write_text("round\n1\n")
    none_finished = _verdict(exp, tmp_path)
    assert none_finished.verdict == cl.OPEN and none_finished.tests[0][2].p < 0.05
    assert "local ran fewer rounds than planned" in none_finished.reason
    assert none_finished.line == "goes on: finish the runs of local (their planned rounds)"
    shutil.rmtree(tmp_path / "runs" / "tiny" / "fedavg-s2")  # a seed to add as well: the line names both
    assert _verdict(exp, tmp_path).line == ("goes on: finish the runs of local (their planned rounds); "
                                            "run fedavg at seed 2")


def test_lower_is_better_metrics_turn_the_direction():
    import pandas as pd

    a = {0: pd.Series([2.0, 3.0], index=["c1", "c2"]), 1: pd.Series([1.0], index=["c1"]),
         3: pd.Series([5.0], index=["c1"])}
    b = {0: pd.Series([4.0, 1.0, 9.0], index=["c2", "c1", "c3"]), 2: pd.Series([0.0], index=["c1"]),
         3: pd.Series([7.0], index=["c1"])}
    # paired by (seed, client) at seeds 0 and 3 (seeds 1 and 2 lack a partner), then one value per
    # client: c1 the mean of 2 - 1 and 5 - 7, c2 (seed 0 only) 3 - 4
    assert cl.paired_differences(a, b, lower_is_better=False).tolist() == [-0.5, -1.0]
    assert cl.paired_differences(a, b, lower_is_better=True).tolist() == [0.5, 1.0]


def test_too_few_clients_or_missing_runs_are_inconclusive_and_missing_data_not_testable(tmp_path):
    exp = _table(tmp_path)
    one_seed = Experiment(**{**exp.__dict__, "seeds": (0,)})
    _write_runs(exp, tmp_path / "runs", {"fedavg": 0.8, "local": 0.6}, clients=CLIENTS[:4])
    two = cl.Claim(**{**CLAIM.__dict__})
    got = cl.evaluate(two, tmp_path / "runs", tmp_path, tmp_path / "data", {exp.key: one_seed})
    assert got.verdict == cl.OPEN and got.tests[0][2].n == 4  # 4 clients: under MIN_CLIENTS
    more_seeds = _verdict(exp, tmp_path)  # seeds add no clients
    assert more_seeds.verdict == cl.OPEN and more_seeds.tests[0][2].n == 4
    assert got.line.startswith("stops: inconclusive, with every seed the table plans run to its planned rounds")
    shutil.rmtree(tmp_path / "runs" / "tiny" / "local-s0")
    shutil.rmtree(tmp_path / "runs" / "tiny" / "local-s1")
    shutil.rmtree(tmp_path / "runs" / "tiny" / "local-s2")
    gone = _verdict(exp, tmp_path)
    assert gone.verdict == cl.OPEN and gone.reason == f"no run of local with numbers in {tmp_path / 'runs' / 'tiny'}"
    assert gone.line == "goes on: run local (`fedwear reproduce tiny:table`)"
    earlier = tmp_path / "runs" / "tiny" / "local-s0"  # a run of the table's config before it changed
    shutil.copytree(tmp_path / "runs" / "tiny" / "fedavg-s0", earlier)
    (earlier / "config.yaml").write_text(dump_config(plan(exp, tmp_path / "runs" / "tiny", None)[0][1]
                                                     .model_copy(update={"method": "local", "rounds": 9})))
    stale = _verdict(exp, tmp_path)
    assert stale.verdict == cl.OPEN and "(local-s0 there: runs of an earlier config of the table" in stale.reason
    assert stale.line == "goes on: run local (`fedwear reproduce tiny:table --methods local --overwrite`)"
    absent = cl.Claim(id="x", statement="s", source="t", view="generalization", metric="macro_f1",
                      comparisons=(("fedali", "fedavg"),), dataset="HHAR")
    out = cl.evaluate(absent, tmp_path / "runs", tmp_path, tmp_path / "data", {})
    assert out.verdict == cl.UNTESTABLE and out.reason == f"HHAR is not in {tmp_path / 'data'}"


def test_the_results_files_at_round_is_respected(tmp_path):
    exp = _table(tmp_path)
    _write_runs(exp, tmp_path / "runs", {"fedavg": 0.8, "local": 0.6})
    # at round 2 only round 0 is left, where both methods score the same: no difference to test
    (tmp_path / "tiny.md").write_text("# tiny\n\nProduced by `fedwear reproduce tiny:table --out "
                                      "somewhere/tiny --at-round 2` (fedwear 0).\n")
    got = _verdict(exp, tmp_path)
    assert got.verdict == cl.OPEN and got.tests[0][2].effect == 0.0
    shutil.rmtree(tmp_path / "runs" / "tiny" / "local-s2")  # undecided with a seed to add: the line goes on
    assert _verdict(exp, tmp_path).line == "goes on: run local at seed 2"


def test_fedalis_global_views_are_read_at_the_global_models_best_round(tmp_path):
    """In a table of FedAli's shape the personalized view is read at the best personalized round,
    the global model's views (pooled, and per client) at the best pooled accuracy, as the Global
    column of the results file."""
    import pandas as pd

    exp = Experiment(**{**_table(tmp_path).__dict__, "writer": "views"})
    cfg = plan(exp, tmp_path / "runs" / "tiny", None)[0][1]
    rows = []
    for r, pers, pooled in ((2, 0.5, 0.9), (3, 0.8, 0.7)):
        rows += [{"round": r, "client": c, "view": "personalized", "split": "test", "n": 10, "n_train": 20,
                  "accuracy": pers} for c in CLIENTS]
        rows += [{"round": r, "client": c, "view": "global", "split": "test", "n": 10, "n_train": 20,
                  "accuracy": pooled} for c in CLIENTS]
        rows.append({"round": r, "client": "pooled", "view": "global_pooled", "split": "test", "n": 40,
                     "n_train": 0, "accuracy": pooled})
    metrics = pd.DataFrame(rows)
    assert cl.selected_round(exp, cfg, metrics, "personalized") == 3
    assert cl.selected_round(exp, cfg, metrics, "global") == 2
    assert cl.selected_round(exp, cfg, metrics, "global_pooled") == 2


def test_holm_on_a_hand_computed_case():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> kept at 0.06
    assert cl.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert cl.holm([0.6, float("nan")])[0] == 0.6 and np.isnan(cl.holm([0.6, float("nan")])[1])


def test_every_paper_registers_its_claims_on_known_tables():
    for paper in cl.PAPERS:
        claims = cl.paper_claims(paper)
        assert 3 <= len(claims) <= 8, paper
        assert all(c.experiment in EXPERIMENTS or c.dataset for c in claims)
    bad = yaml.safe_load("- {id: a, statement: s, source: t, view: personalized, metric: accuracy, better: x}")
    with pytest.raises(ConfigError, match="claim a needs better and than"):
        cl.parse_claims(bad, "papers/x.yaml")


def test_reproduce_claims_writes_the_ledger(tmp_path):
    out = tmp_path / "claims.md"
    res = CliRunner().invoke(app, ["reproduce", "fedmat", "--claims", "--runs-root", str(tmp_path / "runs"),
                                   "--results", str(out), "--root", str(tmp_path / "data")])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert f"Produced by `fedwear reproduce fedmat --claims --root {tmp_path / 'data'} --results {out} " \
           f"--runs-root {tmp_path / 'runs'}`" in text
    assert "### fedmat-nofmask-weakest: inconclusive at this budget" in text and "Wilcoxon" in text
    every = CliRunner().invoke(app, ["reproduce", "--claims", "--runs-root", str(tmp_path / "runs"),
                                     "--results", str(out)])
    assert every.exit_code == 0 and "## protohar" in out.read_text() and "## fedmat" in out.read_text()
    bad = CliRunner().invoke(app, ["reproduce", "nopaper", "--claims"])
    assert bad.exit_code != 0 and "error: --claims 'nopaper': name a paper" in bad.output


def test_compare_test_against_adds_the_paired_test_of_each_method(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_config(rounds=2)))
    out = tmp_path / "cmp"
    args = ["compare", str(config), "--methods", "fedavg,local", "--seeds", "0,1", "--out", str(out), "--quiet"]
    res = CliRunner().invoke(app, [*args, "--test-against", "fedavg"])
    assert res.exit_code == 0, res.output
    md = (out / "table.md").read_text()
    assert "p (Holm)" in md and "two-sided Wilcoxon signed-rank test" in md and "Holm-corrected" in md
    lines = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| ")}
    assert "| reference |" in lines["| fedavg"] and lines["| local"].endswith(" | 7 |")
    # 7 clients: each seed trains 6 of the 8 (its held-out 2 differ), each averaged over its seeds
    bad = CliRunner().invoke(app, [*args, "--test-against", "fedprox"])
    assert bad.exit_code != 0 and "error: --test-against 'fedprox' is not one of --methods" in bad.output
