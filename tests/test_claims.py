"""The claims ledger (``fedwear reproduce --claims``), its test and calibration, and the paired
tests of ``fedwear compare``."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
import yaml
from statsmodels.stats.anova import anova_lm
from typer.testing import CliRunner

from fedwear.cli import app
from fedwear.config import dump_config
from fedwear.errors import ConfigError, FedwearError
from fedwear.reproduce import EXPERIMENTS, Experiment, plan
from fedwear.reproduce import calibration as cal
from fedwear.reproduce import claims as cl
from fedwear.reproduce.seed_test import seed_client_test
from tests.helpers import tiny_config

CLIENTS = tuple(f"c{i}" for i in range(1, 11))
RUNS = Path(__file__).parent.parent / "results" / "runs"


def _table(tmp_path: Path, seeds: tuple[int, ...] = (0, 1, 2)) -> Experiment:
    """A table of two methods on a tiny config, its runs in ``tmp_path/runs/tiny``."""
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_config()))
    return Experiment(key="tiny:table", title="tiny", config=str(config), methods=("fedavg", "local"),
                      seeds=seeds, folder="tiny", results="tiny.md")


def _write_runs(exp: Experiment, runs_root: Path, accuracy: dict[str, float], clients: tuple[str, ...] = CLIENTS,
                val: bool = False) -> None:
    """Run folders of ``exp`` whose metrics.csv give each client ``accuracy[method]`` plus a
    client effect and a little (seed, client) noise at round 3 (the final one), 0.1 at round 0
    (and with ``val``, a validation split whose best round is 0)."""
    for method, cfg, where in plan(exp, runs_root / "tiny", None):
        where.mkdir(parents=True, exist_ok=True)
        (where / "config.yaml").write_text(dump_config(cfg))
        noise = np.random.default_rng([cfg.seed, len(method)]).normal(0, 0.01, len(clients))
        rows = ["round,client,view,split,n,n_train,accuracy,macro_f1,auc"]
        for k, client in enumerate(clients):
            acc = accuracy[method] + 0.01 * k + noise[k]
            rows += [f"0,{client},personalized,test,10,20,0.1,0.1,0.5",
                     f"3,{client},personalized,test,10,20,{acc},{acc - 0.1},0.9"]
            if val:
                rows += [f"0,{client},personalized,val,10,20,0.9,0.9,0.9", f"3,{client},personalized,val,10,20,0.2,0.2,0.2"]
        (where / "metrics.csv").write_text("\n".join(rows) + "\n")
        (where / "rounds.csv").write_text("round\n" + "".join(f"{r}\n" for r in range(1, cfg.rounds + 1)))


CLAIM = cl.Claim(id="tiny-claim", statement="FedAvg beats Local", source="nowhere, Table 0", view="personalized",
                 metric="accuracy", comparisons=(("fedavg", "local"),), experiment="tiny:table")


def _verdict(exp: Experiment, tmp_path: Path, claim: cl.Claim = CLAIM) -> cl.Outcome:
    return cl.evaluate(claim, tmp_path / "runs", tmp_path / "data", {exp.key: exp})


def test_a_verdict_follows_the_numbers_and_flips_when_the_runs_are_swapped(tmp_path):
    exp = _table(tmp_path)
    _write_runs(exp, tmp_path / "runs", {"fedavg": 0.8, "local": 0.6})
    got = _verdict(exp, tmp_path)
    assert got.verdict == cl.HOLDS
    (c,) = got.tests
    assert c.test.seeds == 3 and c.test.clients == 10 and c.test.design == "crossed"
    assert c.test.effect == pytest.approx(20.0, abs=1.0) and c.test.low > 0 and c.p_holm < 0.05
    assert got.runs == {"fedavg": "s0 (3/3), s1 (3/3), s2 (3/3)", "local": "s0 (3/3), s1 (3/3), s2 (3/3)"}
    assert got.line == "stops: every seed the table plans has run to its planned rounds"
    runs = tmp_path / "runs" / "tiny"
    for seed in (0, 1, 2):  # the two methods' numbers swapped: the same evidence, the other way
        a, b = runs / f"fedavg-s{seed}" / "metrics.csv", runs / f"local-s{seed}" / "metrics.csv"
        held = a.read_text()
        shutil.copy(b, a)
        b.write_text(held)
    flipped = _verdict(exp, tmp_path)
    assert flipped.verdict == cl.FAILS
    assert flipped.tests[0].test.effect == pytest.approx(-c.test.effect) and flipped.tests[0].test.high < 0
    assert flipped.tests[0].test.p == pytest.approx(c.test.p)


def test_one_seed_decides_nothing_and_says_so(tmp_path):
    exp = _table(tmp_path, seeds=(0,))
    _write_runs(exp, tmp_path / "runs", {"fedavg": 0.8, "local": 0.6})
    got = _verdict(exp, tmp_path)
    (c,) = got.tests
    assert got.verdict == cl.OPEN and c.test.design == "one seed" and np.isnan(c.test.p)
    assert "cannot see the seed-to-seed variance" in cl.comparison_line(c, "accuracy", 0.0)


def test_a_run_short_of_its_rounds_is_not_compared_and_the_line_goes_on(tmp_path):
    exp = _table(tmp_path)
    _write_runs(exp, tmp_path / "runs", {"fedavg": 0.8, "local": 0.6})
    (tmp_path / "runs" / "tiny" / "local-s1" / "rounds.csv").write_text("round\n1\n")
    got = _verdict(exp, tmp_path)
    assert got.tests[0].test.seeds == 2  # seeds 0 and 2: local's s1 is short of its rounds
    assert got.runs["local"] == "s0 (3/3), s1 (1/3), s2 (3/3)"
    assert got.line == "goes on: run local at seed 1 (runs of local under way: resume them)"
    for seed in (0, 2):
        (tmp_path / "runs" / "tiny" / f"local-s{seed}" / "rounds.csv").write_text("round\n1\n")
    none_finished = _verdict(exp, tmp_path)
    assert none_finished.verdict == cl.OPEN and not none_finished.tests
    assert none_finished.reason.startswith("no run of local at its planned rounds")
    shutil.rmtree(tmp_path / "runs" / "tiny" / "local-s0")
    shutil.rmtree(tmp_path / "runs" / "tiny" / "local-s1")
    shutil.rmtree(tmp_path / "runs" / "tiny" / "local-s2")
    gone = _verdict(exp, tmp_path)
    assert gone.verdict == cl.OPEN and gone.line == "goes on: run local at seeds 0, 1, 2"
    earlier = tmp_path / "runs" / "tiny" / "local-s0"  # a run of the table's config before it changed
    shutil.copytree(tmp_path / "runs" / "tiny" / "fedavg-s0", earlier)
    (earlier / "config.yaml").write_text(dump_config(plan(exp, tmp_path / "runs" / "tiny", None)[0][1]
                                                     .model_copy(update={"method": "local", "rounds": 9})))
    stale = _verdict(exp, tmp_path)
    assert stale.verdict == cl.OPEN and "`fedwear reproduce tiny:table --methods local --overwrite`" in stale.line
    absent = cl.Claim(id="x", statement="s", source="t", view="generalization", metric="macro_f1",
                      comparisons=(("fedali", "fedavg"),), dataset="HHAR")
    out = cl.evaluate(absent, tmp_path / "runs", tmp_path / "data", {})
    assert out.verdict == cl.UNTESTABLE and out.reason == f"HHAR is not in {tmp_path / 'data'}"


def test_no_text_in_a_results_file_moves_a_verdict(tmp_path):
    """Budgets, folders and rounds come from the registry: a results file's "Produced by" line
    edited to another --at-round and --out changes nothing."""
    exp = _table(tmp_path)
    _write_runs(exp, tmp_path / "runs", {"fedavg": 0.8, "local": 0.6})
    before = _verdict(exp, tmp_path)
    (tmp_path / "tiny.md").write_text("# tiny\n\nProduced by `fedwear reproduce tiny:table --out "
                                      "somewhere/else --at-round 1` (fedwear 0).\n")
    after = cl.evaluate(CLAIM, tmp_path / "runs", tmp_path / "data", {exp.key: exp})
    assert (after.verdict, after.line, after.runs) == (before.verdict, before.line, before.runs)
    assert after.tests[0].test == before.tests[0].test


def test_runs_are_read_at_the_final_round_or_the_best_on_validation_never_on_test(tmp_path):
    exp = _table(tmp_path)
    _write_runs(exp, tmp_path / "runs", {"fedavg": 0.8, "local": 0.6})
    got = _verdict(exp, tmp_path)
    assert got.tests[0].test.effect == pytest.approx(20.0, abs=1.0)  # round 3, the final one
    cfg = plan(exp, tmp_path / "runs" / "tiny", None)[0][1]
    metrics = pd.read_csv(tmp_path / "runs" / "tiny" / "fedavg-s0" / "metrics.csv")
    assert cl.selected_round(exp, cfg, metrics, "personalized") == 3
    _write_runs(exp, tmp_path / "runs", {"fedavg": 0.8, "local": 0.6}, val=True)
    metrics = pd.read_csv(tmp_path / "runs" / "tiny" / "fedavg-s0" / "metrics.csv")
    assert cl.selected_round(exp, cfg, metrics, "personalized") == 0  # the validation split's best
    on_val = _verdict(exp, tmp_path)
    assert on_val.verdict == cl.OPEN and on_val.tests[0].test.effect == 0.0  # round 0: both at 0.1
    assert on_val.tests[0].effect_on_test == pytest.approx(20.0, abs=1.0)  # the paper's selection, shown


def test_fedalis_global_views_are_selected_by_the_global_models_rule(tmp_path):
    """In a table of FedAli's shape the personalized view is selected by the best personalized
    round, the global model's views (pooled, and per client) by the best pooled accuracy."""
    exp = Experiment(**{**_table(tmp_path).__dict__, "writer": "views"})
    cfg = plan(exp, tmp_path / "runs" / "tiny", None)[0][1]
    rows = []
    for r, pers, pooled in ((2, 0.5, 0.9), (3, 0.8, 0.7)):
        for split in ("test", "val"):
            rows += [{"round": r, "client": c, "view": "personalized", "split": split, "n": 10, "n_train": 20,
                      "accuracy": pers} for c in CLIENTS]
            rows += [{"round": r, "client": c, "view": "global", "split": split, "n": 10, "n_train": 20,
                      "accuracy": pooled} for c in CLIENTS]
            rows.append({"round": r, "client": "pooled", "view": "global_pooled", "split": split, "n": 40,
                         "n_train": 0, "accuracy": pooled})
    metrics = pd.DataFrame(rows)
    for on_test in (False, True):
        assert cl.selected_round(exp, cfg, metrics, "personalized", on_test) == 3
        assert cl.selected_round(exp, cfg, metrics, "global", on_test) == 2
        assert cl.selected_round(exp, cfg, metrics, "global_pooled", on_test) == 2


def test_verdicts_are_symmetric_and_holm_adjusted_over_a_claims_comparisons():
    def frame(mean: float) -> pd.DataFrame:
        rng = np.random.default_rng(0)
        return pd.DataFrame([{"seed": s, "client": c, "diff": mean + 0.3 * s + rng.normal(0, 1)}
                             for s in range(3) for c in range(12)])

    clear, weak, weaker = (seed_client_test(frame(m)) for m in (5.0, 0.65, 0.6))
    assert clear.p < 0.01 and 0.025 < weak.p < weaker.p < 0.05  # each decided alone
    assert [c.verdict for c in cl.decide([("a", "b", weak)], 0.0)] == [cl.HOLDS]
    got = cl.decide([("a", "b", clear), ("a", "c", weak), ("a", "d", weaker)], 0.0)  # Holm: x3, x2, x1
    assert [c.verdict for c in got] == [cl.HOLDS, cl.OPEN, cl.OPEN]
    assert got[1].p_holm == pytest.approx(2 * weak.p) and got[2].p_holm == pytest.approx(2 * weak.p)
    assert cl.verdict_of(got) == cl.OPEN
    against = cl.decide([("a", "b", seed_client_test(frame(-5.0)))], 0.0)
    assert against[0].verdict == cl.FAILS and against[0].p_holm < 0.05
    # non-inferiority: 0.9 below with a margin of 2 is no worse than the margin allows
    slightly_worse = seed_client_test(frame(-0.9), margin=2.0)
    assert cl.decide([("a", "b", slightly_worse)], 2.0)[0].verdict == cl.HOLDS
    assert cl.decide([("a", "b", seed_client_test(frame(-9.0), margin=2.0))], 2.0)[0].verdict == cl.FAILS


def test_held_out_clients_drawn_per_seed_are_tested_over_the_seeds():
    d = pd.DataFrame({"seed": [0, 1, 2, 3, 4], "client": ["u7", "u9", "u12", "u1", "u6"],
                      "diff": [3.0, 5.0, 4.0, 6.0, 2.0]})
    got = seed_client_test(d)
    assert got.design == "nested" and got.df == 4 and got.effect == pytest.approx(4.0)
    from scipy import stats

    assert got.p == pytest.approx(stats.ttest_1samp(d["diff"], 0.0).pvalue)


def test_the_crossed_mean_squares_are_statsmodels_anova():
    d = np.random.default_rng(3).normal(size=(1, 3, 7)) + np.arange(7)
    frame = pd.DataFrame([{"seed": s, "client": c, "diff": d[0, s, c]} for s in range(3) for c in range(7)])
    table = anova_lm(smf.ols("diff ~ C(seed) + C(client)", data=frame).fit())
    assert cal.mean_squares(d)[0] == pytest.approx(table["mean_sq"].to_numpy())


def test_the_placebo_pairs_disjoint_seeds():
    assert cal.placebo_pairings([0, 1, 2]) == [[(0, 1)], [(0, 2)], [(1, 2)]]
    five = cal.placebo_pairings([0, 1, 2, 3, 4])
    assert len(five) == 30 and all(len({s for p in x for s in p}) == 4 for x in five)


def _committed_series() -> list[dict[int, pd.Series]]:
    """Per-seed client accuracies of FedMAT's table (5 seeds of 7 methods), as the ledger reads them."""
    exp = EXPERIMENTS["fedmat:table-usc_had"]
    out = []
    for method in exp.methods:
        view = "personalized@e4" if method.startswith("fedmat") else "personalized"
        out.append({cfg.seed: cl.client_values(exp, cfg, pd.read_csv(where / "metrics.csv"), view, "accuracy")
                    for m, cfg, where in plan(exp, RUNS / "fedmat-table-usc_had", None) if m == method})
    return out


@pytest.mark.slow
def test_the_ledgers_test_holds_its_level_where_the_client_only_test_did_not():
    """Placebo comparisons of the committed runs (a method's seeds against its other seeds) and
    simulated nulls at measured variance components: the ledger's test decides at most 5%; the
    earlier client-only Wilcoxon decides far more (put it back as the ledger's test and this fails)."""
    got = cal.placebo(_committed_series())
    ledger, old = cal.CANDIDATES[0], cal.CANDIDATES[2]
    assert got.total[2] == 210
    assert got.decided[ledger, 2] / got.total[2] <= 0.05 < got.decided[old, 2] / got.total[2]
    rng = np.random.default_rng(0)
    for sd in ((1.44, 6.1, 4.48), (0.26, 1.24, 0.69), (0.0, 2.87, 7.02), (1.0, 0.0, 1.0)):  # measured, and seed-only
        for seeds in (2, 3, 5):
            rates = cal.simulate(sd, seeds, 14, 0.0, rng, replicates=1000)
            assert rates[ledger] <= 0.05 + 0.02, (sd, seeds, rates)  # 2 Monte-Carlo standard errors
    assert cal.simulate((1.0, 0.0, 1.0), 3, 14, 0.0, rng, replicates=1000)[old] > 0.3


def test_paper_effects_come_from_the_registered_tables():
    assert cal.paper_effect("protohar:table2", "personalized", "accuracy", "protohar", "fedrep") == \
        pytest.approx(76.416 - 70.582)
    assert cal.paper_effect("pcfedh:table2_ppg_dalia", "personalized", "mse", "pcfedh", "fedavg") == \
        pytest.approx(2.621 - 2.549)  # lower is better: positive when PCFedH's MSE is lower
    assert cal.paper_effect("fedali:table1", "generalization", "macro_f1", "fedali", "fedavg") == \
        pytest.approx(81.84 - 75.85)
    assert cal.paper_effect(None, "personalized", "accuracy", "a", "b") is None


def test_a_convergence_claim_compares_rounds_to_the_target_over_seeds(tmp_path):
    exp = _table(tmp_path)
    runs = tmp_path / "runs" / "tiny"
    for method, cfg, where in plan(exp, runs, None):
        where.mkdir(parents=True, exist_ok=True)
        (where / "config.yaml").write_text(dump_config(cfg))
        # fedavg climbs to 0.8 at round 3; local reaches 0.8 at round 1 at seeds 0, 2, round 2 at seed 1
        curve = {"fedavg": [0.2, 0.5, 0.8], "local": [0.8, 0.8, 0.8] if cfg.seed != 1 else [0.5, 0.8, 0.8]}[method]
        rows = ["round,client,view,split,n,n_train,accuracy"]
        rows += [f"{r},{c},personalized,test,10,20,{a}" for r, a in enumerate(curve, 1) for c in CLIENTS]
        (where / "metrics.csv").write_text("\n".join(rows) + "\n")
        (where / "rounds.csv").write_text("round\n1\n2\n3\n")
    claim = cl.Claim(id="fast", statement="s", source="t", view="personalized", metric="accuracy",
                     comparisons=(("local", "fedavg"),), experiment="tiny:table", rounds_to="fedavg")
    got = _verdict(exp, tmp_path, claim)
    assert "s0: local 1, fedavg 3; s1: local 2, fedavg 3; s2: local 1, fedavg 3" in got.reason
    assert got.tests[0].test.seeds == 3 and got.tests[0].test.effect == pytest.approx(np.log(3) * 2 / 3 + np.log(1.5) / 3)


def test_every_paper_registers_its_claims_and_fedwears_own_apart():
    for paper in cl.PAPERS:
        claims = cl.paper_claims(paper)
        assert len([c for c in claims if not c.own]) >= 5, paper
        assert all(c.experiment in EXPERIMENTS or c.dataset for c in claims)
        assert len({c.id for c in claims}) == len(claims)
    assert {c.id for p in cl.PAPERS for c in cl.paper_claims(p) if c.own} >= {"protohar-leakfree", "fedali-leakfree"}
    bad = yaml.safe_load("- {id: a, statement: s, source: t, view: personalized, metric: accuracy, better: x}")
    with pytest.raises(ConfigError, match="claim a needs better and than"):
        cl.parse_claims(bad, "papers/x.yaml")
    margin = yaml.safe_load("- {id: a, statement: s, source: t, view: v, metric: m, better: x, than: y, "
                            "dataset: D, margin: -1}")
    with pytest.raises(ConfigError, match="claim a: margin -1 is not a number >= 0"):
        cl.parse_claims(margin, "papers/x.yaml")


def test_reproduce_claims_writes_the_ledger_with_its_calibration(tmp_path):
    out = tmp_path / "claims.md"
    res = CliRunner().invoke(app, ["reproduce", "fedmat", "--claims", "--runs-root", str(tmp_path / "runs"),
                                   "--results", str(out), "--root", str(tmp_path / "data")])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert f"Produced by `fedwear reproduce fedmat --claims --root {tmp_path / 'data'} --results {out} " \
           f"--runs-root {tmp_path / 'runs'}`" in text
    assert "### fedmat-nofmask-weakest: inconclusive at this budget" in text and "## Calibration of the test" in text
    assert "## fedmat: the paper's claims" in text
    bad = CliRunner().invoke(app, ["reproduce", "nopaper", "--claims"])
    assert bad.exit_code != 0 and "error: --claims 'nopaper': name a paper" in bad.output


def test_compare_test_against_uses_the_ledgers_test(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_config(rounds=2)))
    out = tmp_path / "cmp"
    args = ["compare", str(config), "--methods", "fedavg,local", "--seeds", "0,1", "--out", str(out), "--quiet"]
    res = CliRunner().invoke(app, [*args, "--test-against", "fedavg"])
    assert res.exit_code == 0, res.output
    md = (out / "table.md").read_text()
    assert "p (Holm)" in md and "seeds x clients t test" in md and "Holm-corrected" in md
    lines = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| ")}
    assert "| reference |" in lines["| fedavg"] and lines["| local"].endswith(" | 2 x 5 |")
    # 2 seeds x 5 clients: each seed trains 6 of the 8 (its held-out 2 differ), 5 are at both seeds
    bad = CliRunner().invoke(app, [*args, "--test-against", "fedprox"])
    assert bad.exit_code != 0 and "error: --test-against 'fedprox' is not one of --methods" in bad.output


def test_an_investigation_is_shown_where_the_verdict_is_not_holds():
    entry = yaml.safe_load("- {id: a, statement: s, source: t, view: v, metric: accuracy, better: x, than: y, "
                           "dataset: D, investigation: 'seed 2 diverged:\n  its loss is NaN from round 40'}")
    (claim,) = cl.parse_claims(entry, "papers/x.yaml")
    assert "- Investigation: seed 2 diverged: its loss is NaN from round 40" in cl._claim_lines(cl.Outcome(claim, cl.OPEN))
    assert not any("Investigation" in line for line in cl._claim_lines(cl.Outcome(claim, cl.HOLDS)))


def test_every_claim_compares_methods_its_table_plans_at_two_seeds_or_more():
    """One seed decides nothing: a table that planned one seed of a method a claim compares would
    stop that claim's line with nothing decided."""
    for paper in cl.PAPERS:
        for c in cl.paper_claims(paper):
            if c.experiment:
                exp = EXPERIMENTS[c.experiment]
                for label in cl._labels(c) | ({c.rounds_to} if c.rounds_to else set()):
                    method = label.split("@")[0]
                    assert len(exp.more_seeds.get(method, exp.seeds)) >= 2, (c.id, method)


def test_every_settled_verdict_that_is_not_holds_has_its_investigation_in_the_ledger():
    """A claim whose runs are all done (its line stops) and that does not hold, or stays
    inconclusive, says why in results/claims.md."""
    ledger = (Path(__file__).parent.parent / "results" / "claims.md").read_text()
    missing = []
    for block in ledger.split("\n### ")[1:]:
        head, *lines = block.splitlines()
        if head.endswith(": holds") or head.endswith(": not testable here"):
            continue
        if any(line.startswith("- Line: stops") for line in lines) and \
                not any(line.startswith("- Investigation: ") for line in lines):
            missing.append(head)
    assert not missing, missing


@pytest.mark.parametrize("value", ["nan", "inf", "1.5", "-0.2"])
def test_an_impossible_value_in_a_run_is_one_error_naming_the_file_and_line(tmp_path, value):
    exp = _table(tmp_path)
    _write_runs(exp, tmp_path / "runs", {"fedavg": 0.8, "local": 0.6})
    path = tmp_path / "runs" / "tiny" / "local-s1" / "metrics.csv"
    lines = path.read_text().splitlines()
    cells = lines[4].split(",")
    cells[6] = value  # accuracy of the third row
    lines[4] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(FedwearError, match=rf"{path}, line 5: accuracy is {float(value)}, not a possible value"):
        _verdict(exp, tmp_path)
