"""`fedwear reproduce`: a table's runs, resumable, and a results file next to the paper's numbers."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

import fedwear
from fedwear import reproduce as rp
from fedwear.cli import app
from fedwear.config import dump_config
from fedwear.reproduce.results import write_results
from fedwear.rundir import CHECKPOINT
from tests.helpers import tiny_config


@pytest.fixture
def table(tmp_path, monkeypatch):
    """A two-method table on synthetic data, compared against ProtoHAR's Table II numbers."""
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_config(**{"evaluation.at_start": True})))
    exp = rp.Experiment(key="tiny:t", title="Tiny", config=str(config), methods=("fedavg", "local"),
                        more_seeds={"fedavg": (0, 1)}, sets={"local": ("rounds=2",)},
                        paper="protohar:table2", rounds_table="protohar:table3", run_first=("local",))
    monkeypatch.setitem(rp.EXPERIMENTS, exp.key, exp)
    return exp


def test_plan_validates_every_run_and_runs_the_first_methods_first(table, tmp_path):
    runs = rp.plan(table, tmp_path / "runs", root=None)
    assert [(m, c.seed) for m, c, _ in runs] == [("local", 0), ("fedavg", 0), ("fedavg", 1)]
    assert runs[0][1].rounds == 2 and runs[1][1].rounds == 3
    assert runs[1][2] == tmp_path / "runs" / "fedavg-s0"


def test_reproduce_writes_ours_next_to_the_paper_and_resumes(table, tmp_path):
    out, results = tmp_path / "runs", tmp_path / "results.md"
    args = ["reproduce", "tiny:t", "--out", str(out), "--results", str(results), "--quiet"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    text = results.read_text()
    assert "fedwear reproduce" in text and "Cheng et al." in text
    fedavg = next(line for line in text.splitlines() if line.startswith("| fedavg |"))
    cells = [c.strip() for c in fedavg.split("|")]
    assert cells[3] == "0,1" and cells[4] == "3/3, 3/3"  # seeds and rounds run
    assert cells[6] == "70.81"  # the paper's FedAvg accuracy on USC-HAD
    assert "⚠" in cells[7]  # synthetic data: far from the paper
    local = next(line for line in text.splitlines() if line.startswith("| local |"))
    assert "2/2" in local
    assert "Target: fedavg's best accuracy" in text

    assert f"Produced by `fedwear reproduce tiny:t --out {out} --results {results}`" in text

    first = (out / "fedavg-s0" / "metrics.csv").read_bytes()
    again = CliRunner().invoke(app, args)  # finished runs are reused, not re-run
    assert again.exit_code == 0 and "3 runs" in again.output
    assert (out / "fedavg-s0" / "metrics.csv").read_bytes() == first
    rewritten = CliRunner().invoke(app, [*args, "--report-only"])  # states the command that made the runs
    assert rewritten.exit_code == 0 and results.read_text() == text


def test_methods_runs_a_subset_and_the_file_still_covers_the_table(table, tmp_path):
    out, results = tmp_path / "runs", tmp_path / "results.md"
    args = ["reproduce", "tiny:t", "--out", str(out), "--results", str(results), "--quiet"]
    res = CliRunner().invoke(app, [*args, "--methods", "local"])
    assert res.exit_code == 0, res.output
    assert (out / "local-s0" / "summary.json").exists() and not (out / "fedavg-s0").exists()
    text = results.read_text()
    assert "| local |" in text and "| fedavg |" in text and "--methods" not in text  # the table's own command
    bad = CliRunner().invoke(app, [*args, "--methods", "local,nope"])
    assert bad.exit_code != 0 and "nope not in this table" in bad.output and "Traceback" not in bad.output


def test_seeds_add_runs_and_the_file_keeps_every_seed_of_the_table(table, tmp_path):
    """One more seed of one method: the results file keeps the table's other seeds' rows, and
    names --seeds and --methods only for a seed beyond the table's plan."""
    out, results = tmp_path / "runs", tmp_path / "results.md"
    args = ["reproduce", "tiny:t", "--out", str(out), "--results", str(results), "--quiet"]
    assert CliRunner().invoke(app, args).exit_code == 0
    whole = results.read_text()

    def seeds_of(text: str) -> str:
        return [c.strip() for c in next(x for x in text.splitlines() if x.startswith("| fedavg |")).split("|")][3]

    planned = CliRunner().invoke(app, [*args, "--methods", "fedavg", "--seeds", "1"])
    assert planned.exit_code == 0, planned.output
    assert results.read_text() == whole and seeds_of(whole) == "0,1"
    beyond = CliRunner().invoke(app, [*args, "--methods", "fedavg", "--seeds", "5"])
    assert beyond.exit_code == 0, beyond.output
    text = results.read_text()
    assert seeds_of(text) == "0,1,5" and "| local |" in text and "2/2" in text
    assert "--seeds 5 --methods fedavg" in text


@pytest.mark.slow
def test_overwrite_starts_the_selected_runs_again_and_only_those(table, tmp_path):
    out, results = tmp_path / "runs", tmp_path / "results.md"
    args = ["reproduce", "tiny:t", "--out", str(out), "--results", str(results), "--quiet"]
    assert CliRunner().invoke(app, args).exit_code == 0
    local = (out / "local-s0" / "metrics.csv").read_bytes()
    (out / "fedavg-s0" / "summary.json").unlink()  # stopped before any checkpoint: cannot resume
    (out / "fedavg-s0" / CHECKPOINT).unlink()
    restarted = CliRunner().invoke(app, args)  # the same command starts that run again
    assert restarted.exit_code == 0, restarted.output
    assert "starting it again" in (out / "fedavg-s0" / "run.log").read_text()
    assert (out / "fedavg-s0" / "summary.json").exists()
    assert (out / "local-s0" / "metrics.csv").read_bytes() == local  # finished: reused
    again = CliRunner().invoke(app, [*args, "--methods", "fedavg", "--seeds", "0", "--overwrite"])
    assert again.exit_code == 0, again.output
    assert (out / "local-s0" / "metrics.csv").read_bytes() == local  # not selected: untouched
    assert "--overwrite" not in results.read_text()  # the stated command makes the runs without it
    both = CliRunner().invoke(app, [*args, "--overwrite", "--report-only"])
    assert both.exit_code == 2 and "drop one of them" in both.output


def test_list_shows_how_far_each_table_got(table, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default run folder, runs/tiny-t, is relative
    listed = CliRunner().invoke(app, ["reproduce", "--list"])
    assert listed.exit_code == 0 and "Tiny (2 methods)" in listed.output  # not started: no status
    runs = rp.plan(table, rp.default_out(table), root=None)
    from fedwear.compare import run_one

    run_one(*runs[0][1:], False, True)  # local, 2 rounds: finished
    fedwear.run(runs[1][1], runs[1][2], quiet=True, until=1)  # fedavg seed 0: stopped after round 1 of 3
    listed = CliRunner().invoke(app, ["reproduce", "--list"])
    assert "runs/tiny-t: 1/3 runs finished, 3/8 rounds" in listed.output, listed.output
    (runs[1][2] / "timing.csv").write_bytes(b"\xff\xfe garbage")  # a damaged file: one line naming it
    listed = CliRunner().invoke(app, ["reproduce", "--list"])
    assert listed.exit_code == 2 and "timing.csv is not a readable CSV" in listed.output
    assert "Traceback" not in listed.output


def test_partial_runs_state_the_rounds_they_ran(table, tmp_path):
    runs = rp.plan(table, tmp_path / "runs", root=None)
    from fedwear.compare import run_one

    method, cfg, where = runs[1]
    run_one(cfg.model_copy(update={"rounds": 3}), where, False, True)
    metrics = where / "metrics.csv"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(line for line in lines if not line.startswith("3,")) + "\n")  # stopped after round 2
    text = write_results(table, runs, tmp_path / "r.md", "cmd", tmp_path / "runs")
    fedavg = next(line for line in text.splitlines() if line.startswith("| fedavg |"))
    assert "2/3" in fedavg
    assert "| local |" in text and "not run" in text.split("| local |")[1].splitlines()[0]
    # the table's config changed since local's run: its row is not run, and says which folder holds what
    lmethod, lcfg, lwhere = runs[0]
    run_one(lcfg.model_copy(update={"rounds": 1}), lwhere, False, True)
    (lwhere / "config.yaml").write_text(dump_config(lcfg.model_copy(update={"rounds": 1})))
    text = write_results(table, runs, tmp_path / "r.md", "cmd", tmp_path / "runs")
    row = text.split(f"| {lmethod} |")[1].splitlines()[0]
    assert f"not run (s{lcfg.seed}: runs of an earlier config, rerun with --overwrite)" in row


def test_findings_are_listed_once_beside_the_flagged_rows_of_methods_that_ran(table, tmp_path):
    runs = rp.plan(table, tmp_path / "runs", root=None)
    from fedwear.compare import run_one

    run_one(*runs[1][1:], False, True)  # fedavg seed 0 only; local not run
    exp = replace(table, flagged={"fedavg": "the split", "local": "the split", "fedprox": "not in this table"})
    text = write_results(exp, runs, tmp_path / "r.md", "cmd", tmp_path / "runs")
    bullets = [line for line in text.splitlines() if line.startswith("- **")]
    assert bullets == ["- **fedavg**: the split."]
    # a finding is listed only beside a row that carries a ⚠: without a paper to differ from, none does
    text = write_results(replace(exp, paper=None, rounds_table=None), runs, tmp_path / "r.md", "cmd",
                         tmp_path / "runs")
    assert "⚠" not in text and not [line for line in text.splitlines() if line.startswith("- **")]


def test_the_notes_file_beside_a_results_file_gives_its_prose(table, tmp_path):
    """Protocol, implementations, differences and findings come from notes/<results name>.yaml in
    the results file's folder; without one (fedwear installed alone) the file has no prose."""
    from fedwear.compare import run_one
    from fedwear.errors import ConfigError

    runs = rp.plan(table, tmp_path / "runs", root=None)
    run_one(*runs[1][1:], False, True)  # fedavg seed 0
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "r.yaml").write_text(
        "protocol: three rounds\nvariants: {fedavg: the code's}\ndifferences: [the split, the order]\n"
        "flagged: {fedavg: the seed}\n")
    text = write_results(table, runs, tmp_path / "r.md", "cmd", tmp_path / "runs")
    assert "Protocol: three rounds." in text
    assert "Known differences from a run of the authors' code: the split; the order." in text
    assert "| fedavg | the code's | 0 |" in text and "- **fedavg**: the seed." in text
    alone = write_results(table, runs, tmp_path / "elsewhere" / "r.md", "cmd", tmp_path / "runs")
    assert "Protocol:" not in alone and "Known differences" not in alone and "- **" not in alone
    assert "| fedavg |  | 0 |" in alone
    (tmp_path / "notes" / "r.yaml").write_text("protocl: three rounds\n")
    with pytest.raises(ConfigError, match="a notes file is a mapping of protocol, variants"):
        write_results(table, runs, tmp_path / "r.md", "cmd", tmp_path / "runs")


def test_every_table_has_notes_beside_its_results_naming_only_its_methods():
    from pathlib import Path

    import yaml

    notes = Path(__file__).resolve().parents[1] / "results" / "notes"
    for exp in rp.EXPERIMENTS.values():
        path = notes / f"{Path(exp.results).stem}.yaml"
        got = yaml.safe_load(path.read_text())
        assert got["protocol"], path
        for key in ("variants", "flagged"):
            assert set(got.get(key, {})) <= set(exp.methods), (path, key)
    tables = {Path(exp.results).stem for exp in rp.EXPERIMENTS.values()}
    assert {p.stem for p in notes.glob("*.yaml")} == tables  # none left over from a removed table


def test_unknown_table_is_one_line(table):
    res = CliRunner().invoke(app, ["reproduce", "nope:t"])
    assert res.exit_code == 2 and "unknown table 'nope:t'" in res.output and "tiny:t" in res.output


def test_a_missing_root_is_one_line_before_any_run(tmp_path):
    out = tmp_path / "runs"
    res = CliRunner().invoke(app, ["reproduce", "protohar:table2", "--root", str(tmp_path / "nope"), "--out", str(out)])
    assert res.exit_code == 2 and not out.exists()
    assert res.output.strip().splitlines() == [
        f"error: --root {tmp_path / 'nope'}: no such folder; pass the folder of the usc_had dataset's original "
        "files (see docs/data.md)"]


def test_forecasting_table_cells_are_means_over_clients_next_to_the_paper(tmp_path, monkeypatch):
    """A regression table: per method the final round's mean ± std over clients, the paper's
    PCFedH numbers beside them, and the naive forecasts' rows."""
    import pandas as pd

    from tests.helpers import tiny_regression_config

    config = tmp_path / "hr.yaml"
    config.write_text(dump_config(tiny_regression_config(**{
        "evaluation.client_weights": "uniform", "evaluation.views": "[personalized]"})))
    exp = rp.Experiment(key="tiny:hr", title="Tiny HR", config=str(config), methods=("fedavg", "fedprox"),
                        paper="pcfedh:table2_ppg_dalia", flagged={"fedavg": "synthetic series"})
    monkeypatch.setitem(rp.EXPERIMENTS, exp.key, exp)
    from fedwear.reproduce import forecast_results

    monkeypatch.setattr(forecast_results, "DRIFT_ROUNDS", 1)
    out, results = tmp_path / "runs", tmp_path / "results.md"
    res = CliRunner().invoke(app, ["reproduce", "tiny:hr", "--out", str(out), "--results", str(results), "--quiet"])
    assert res.exit_code == 0, res.output
    text = results.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| fedavg |"))
    cells = [c.strip() for c in row.split("|")]
    metrics = pd.read_csv(out / "fedavg-s0" / "metrics.csv")
    pers = metrics[(metrics["view"] == "personalized") & (metrics["split"] == "test")]
    final = pers["round"].max()
    last, before = pers[pers["round"] == final], pers[pers["round"] == final - 1]
    assert cells[5] == f"{last['mse'].mean():.3f} ± {last['mse'].std(ddof=0):.3f}"
    assert cells[6] == "2.621 ± 2.060"  # the paper's FedAvg MSE on PPG-DaLiA
    # how much the MSE still moved over the run's last rounds (here the last one)
    assert cells[-3] == f"{last['mse'].mean() - before['mse'].mean():+.3f} ({final - 1} -> {final})"
    assert "| last_value |" in text and "| client_mean |" in text
    assert "⚠" in row and "- **fedavg**: synthetic series." in text  # the flagged row's finding beside it


def test_views_table_in_fedalis_shape(tmp_path, monkeypatch):
    """Personalization / Generalization at the best mean personalization accuracy, Global from
    the pooled view at its own best round, Local per client (flagged), costs relative to FedAvg."""
    import json

    import pandas as pd

    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_config(**{
        "evaluation.views": "[personalized, generalization, global_pooled]",
        "evaluation.best_statistic": "mean",
        "evaluation.best_for": "{global_pooled: global_pooled.accuracy}"})))
    exp = rp.Experiment(key="tiny:v", title="Tiny views", config=str(config), methods=("fedavg", "local"),
                        sets={"local": ("evaluation.best_statistic=per_client",)}, paper="fedali:table1",
                        writer="views")
    monkeypatch.setitem(rp.EXPERIMENTS, exp.key, exp)
    out, results = tmp_path / "runs", tmp_path / "results.md"
    res = CliRunner().invoke(app, ["reproduce", "tiny:v", "--out", str(out), "--results", str(results), "--quiet"])
    assert res.exit_code == 0, res.output
    text = results.read_text()
    m = pd.read_csv(out / "fedavg-s0" / "metrics.csv")
    summary = json.loads((out / "fedavg-s0" / "summary.json").read_text())
    r = summary["best_round"]
    pers = m[(m["round"] == r) & (m["view"] == "personalized") & (m["split"] == "test")]["macro_f1"]
    fedavg = next(line for line in text.splitlines() if line.startswith("| fedavg |"))
    cells = [c.strip() for c in fedavg.split("|")]
    assert cells[5] == str(r)
    assert cells[6] == f"{100 * pers.mean():.2f} ± {100 * pers.std(ddof=0):.2f}"
    g = summary["best"]["global_pooled"]
    assert cells[8].startswith(f"{100 * g['accuracy']:.2f} / {100 * g['macro_f1']:.2f}")
    local = next(line for line in text.splitlines() if line.startswith("| local † |"))
    assert "per client" in local and local.rstrip().endswith("| N/A |")
    cost = next(line for line in text.split("Cost per round")[1].splitlines() if line.startswith("| fedavg |"))
    cost = [c.strip() for c in cost.split("|")]
    held = pd.read_csv(out / "fedavg-s0" / "rounds.csv")["training_bytes"].median()
    assert cost[2:4] == ["0", "3/3"]  # the row's seeds and rounds run
    assert cost[6] == f"{held / 1e6:.2f}" and cost[5:10:2] == ["1.00×"] * 3
    assert "Ek et al. 2024, Table 1" in text and "| fedali | 98.15 ± 1.75" in text


def test_at_round_writes_each_row_as_a_run_stopped_at_that_round(tmp_path, monkeypatch):
    """``--at-round R`` on finished runs gives the rows of runs paused at R with ``--until R``."""
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_config(**{
        "evaluation.views": "[personalized, generalization, global_pooled]",
        "evaluation.best_statistic": "mean", "evaluation.at_start": True})))
    exp = rp.Experiment(key="tiny:a", title="Tiny at-round", config=str(config), methods=("fedavg",),
                        writer="views")
    monkeypatch.setitem(rp.EXPERIMENTS, exp.key, exp)

    def table(out: str, *options: str) -> list[str]:
        results = tmp_path / f"{out}.md"
        res = CliRunner().invoke(app, ["reproduce", "tiny:a", "--out", str(tmp_path / out), "--results",
                                       str(results), "--quiet", *options])
        assert res.exit_code == 0, res.output
        return [line for line in results.read_text().splitlines() if line.startswith("| fedavg |")]

    paused = table("paused", "--until", "2")
    full = table("full")
    cut = table("full", "--report-only", "--at-round", "2")
    assert "| 2/3 |" in paused[0] and "| 3/3 |" in full[0]
    assert cut[0] == paused[0] != full[0]
    assert "--at-round 2" in (tmp_path / "full.md").read_text()
    table("short", "--until", "1")  # a run still short of round 2 (running, or paused before it)
    seed = tiny_config().seed
    assert f"| none shown (s{seed}: 1/3, short of round 2) |" in table("short", "--report-only", "--at-round", "2")[0]


def test_global_cell_spreads_over_seeds_only_when_there_are_several():
    from fedwear.reproduce.run_files import seed_cell

    assert seed_cell([90.0, 94.0]) == "92.00 ± 2.00" and seed_cell([91.5]) == "91.50"


def test_every_packaged_config_has_its_twin_in_configs_and_every_table_plans():
    """`configs/<paper>/<name>.yaml` is the packaged `<paper>_<name>.yaml` (users read the one,
    `fedwear reproduce` runs the other), and every table's runs validate."""
    from importlib import resources
    from pathlib import Path

    packaged = sorted((resources.files("fedwear.reproduce") / "configs").iterdir(), key=lambda p: p.name)
    assert packaged
    for f in packaged:
        paper, _, name = f.name.partition("_")
        twin = Path("configs") / paper / name
        assert twin.read_text() == f.read_text(), f"{twin} differs from the packaged {f.name}"
    for key, exp in rp.EXPERIMENTS.items():
        assert rp.plan(exp, rp.default_out(exp), root="/nowhere"), key


def test_budget_table_in_metahars_shape(tmp_path, monkeypatch):
    """One row per budget: meta-train = personalized@<budget>, meta-test = new_clients@<budget>,
    each the final round's test-weighted accuracy; FedAvg's row has no budget."""
    import pandas as pd

    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_config(rounds=2, **{
        "optimizer.name": "adam", "optimizer.lr": 0.001, "batch_size": 16, "evaluation.views": "[personalized, new_clients]",
        "method_options.metahar.finetune_epochs": 1})))
    exp = rp.Experiment(key="tiny:b", title="Tiny budgets", config=str(config), methods=("fedavg", "metahar"),
                        paper="metahar:table1_usc_had", writer="budgets", flagged={"metahar": "what was found"},
                        extra_metrics=("macro_f1",), context=("fedmat:adaptation",))
    monkeypatch.setitem(rp.EXPERIMENTS, exp.key, exp)
    out, results = tmp_path / "runs", tmp_path / "results.md"
    res = CliRunner().invoke(app, ["reproduce", "tiny:b", "--out", str(out), "--results", str(results), "--quiet"])
    assert res.exit_code == 0, res.output
    text = results.read_text()
    m = pd.read_csv(out / "metahar-s0" / "metrics.csv")
    last = m[(m["round"] == 2) & (m["split"] == "test")]
    for n in (1, 2, 3):
        row = next(line for line in text.splitlines() if line.startswith(f"| metahar | n{n} |"))
        cells = [c.strip() for c in row.split("|")]
        for view, col, metric in (("personalized", 6, "accuracy"), ("new_clients", 9, "accuracy"),
                                  ("personalized", 12, "macro_f1"), ("new_clients", 13, "macro_f1")):
            sel = last[last["view"] == f"{view}@n{n}"]
            assert cells[col] == f"{100 * np.average(sel[metric], weights=sel['n']):.2f}", (n, view, metric)
    n3 = [c.strip() for c in next(line for line in text.splitlines() if line.startswith("| metahar | n3 |")).split("|")]
    assert (n3[7], n3[10]) == ("93.79", "91.07")
    for ours, paper, delta in ((n3[6], 93.79, n3[8]), (n3[9], 91.07, n3[11])):
        d = float(ours) - paper
        assert delta == f"{d:+.2f}" + (" ⚠" if abs(d) > 2 else ""), (ours, paper, delta)
    assert ("- **metahar**: what was found." in text) == ("⚠" in n3[8] + n3[11])
    assert next(line for line in text.splitlines() if line.startswith("| fedavg | - |"))
    assert "meta-train macro_f1 | meta-test macro_f1 | CPU-s" in text
    assert "(Shen et al. 2022, poster, Model Adaptation" in text and "| FedMAT | 95.83 | 95.81 |" in text


def test_budget_table_splits_meta_test_users_by_source(tmp_path, monkeypatch):
    """A merged dataset's table adds a meta-test column per source (Meta-HAR's Table 2: meta-test
    (H) and (U)), each the final-round test-weighted accuracy of that source's held-out users."""
    import pandas as pd

    from fedwear.config import load_config
    from fedwear.data import load_federated

    two = {
        "name": "merged", "cache_dir": None, "rate_hz": 25.0, "window": 20, "normalize": "none",
        "held_out": 1, "held_out_per": "source",
        "sources": [
            {"name": "synthetic", "tag": "a", "synthetic": {"num_subjects": 3, "rate_hz": 50.0, "seconds_per_class": 8.0}},
            {"name": "synthetic", "tag": "b", "synthetic": {"num_subjects": 3, "rate_hz": 25.0, "seconds_per_class": 8.0}},
        ],
    }  # fmt: skip
    cfg = load_config(data={**tiny_config(rounds=1, batch_size=8).model_dump(mode="json"), "dataset": two,
                            "evaluation": {"views": ["personalized", "new_clients"], "adapt_epochs": 1}})
    held = load_federated(cfg.dataset, 0).info["held_out"]
    assert sorted(c[0] for c in held) == ["a", "b"]
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(cfg))
    exp = rp.Experiment(key="tiny:m", title="Tiny merged", config=str(config), methods=("fedavg",), writer="budgets")
    monkeypatch.setitem(rp.EXPERIMENTS, exp.key, exp)
    out, results = tmp_path / "runs", tmp_path / "results.md"
    res = CliRunner().invoke(app, ["reproduce", "tiny:m", "--out", str(out), "--results", str(results), "--quiet"])
    assert res.exit_code == 0, res.output
    lines = results.read_text().splitlines()
    head = [c.strip() for c in next(x for x in lines if x.startswith("| Method |")).split("|")]
    row = [c.strip() for c in next(x for x in lines if x.startswith("| fedavg |")).split("|")]
    m = pd.read_csv(out / "fedavg-s0" / "metrics.csv")
    new = m[(m["view"] == "new_clients") & (m["split"] == "test")]
    for tag in ("a", "b"):
        sel = new[new["client"].str.startswith(f"{tag}-")]
        assert len(sel) == 1
        assert row[head.index(f"meta-test {tag}")] == f"{100 * np.average(sel['accuracy'], weights=sel['n']):.2f}"


def test_views_cells_say_which_split_chose_the_best_rounds():
    """The paper's protocol selects on test data and says so; the leakage-free one selects on
    validation data, the global row by the global view there."""
    from fedwear.reproduce.views_results import _cells_text

    paper = _cells_text(tiny_config(**{"evaluation.best_split": "test"}).evaluation)
    assert "on the test split" in paper and "its best pooled accuracy" in paper
    assert paper.count("selection on test data, as the paper") == 2
    leakfree = _cells_text(tiny_config(**{
        "evaluation.best_split": "val", "dataset.val_fraction": 0.2,
        "evaluation.views": "[personalized, global, global_pooled]",
        "evaluation.best_for": "{global_pooled: global.accuracy}"}).evaluation)
    assert "test split" not in leakfree and "test data, as" not in leakfree
    assert "the global view's best accuracy (unweighted mean over clients) on the validation split" in leakfree
