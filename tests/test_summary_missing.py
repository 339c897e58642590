"""A view's final and best numbers say whom they cover: ``n_clients`` per view, and the clients
evaluated in other rounds but missing from that one named in summary.json and the printed table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fedwear
from fedwear.engines.runner import Callback
from fedwear.engines.sim import SimExecutor
from fedwear.report.tables import summary_table
from fedwear.summary import build_summary
from tests.helpers import tiny_config, tiny_regression_config

ROUND_COLUMNS = ["round", "bytes_up", "bytes_down", "eval_bytes_up", "eval_bytes_down", "aggregated"]


def frame(rows: list[tuple[int, str, float]]) -> pd.DataFrame:
    """metrics.csv rows of the personalized view on the test split: (round, client, accuracy)."""
    return pd.DataFrame([{"round": r, "client": c, "view": "personalized", "split": "test", "n": 10,
                          "n_train": 20, "accuracy": a, "macro_f1": a, "auc": a} for r, c, a in rows])


def summary_of(cfg, metrics: pd.DataFrame) -> dict:
    rounds = pd.DataFrame([{k: 0 for k in ROUND_COLUMNS} | {"round": r, "aggregated": 1}
                           for r in sorted(set(metrics["round"]))], columns=ROUND_COLUMNS)
    return build_summary(cfg, metrics, rounds, 0.0, "test")


def test_a_client_missing_from_the_final_round_is_named():
    """s02 answered round 1 and not round 2: the final mean is s01's alone, and says so."""
    s = summary_of(tiny_config(rounds=2), frame([(1, "s01", 0.5), (1, "s02", 0.9), (2, "s01", 0.6)]))
    assert s["final"]["personalized"]["accuracy"] == pytest.approx(0.6)  # over the clients present
    assert s["final_stats"]["personalized"]["accuracy"]["std"] == 0.0
    assert s["n_clients"] == {"final": {"personalized": 1}, "best": {"personalized": 2}}
    assert s["missing"] == {"final": {"personalized": ["s02"]}, "best": {}}
    table = summary_table(s)
    assert "| view | n | Acc | F1 | AUC |" in table
    assert "| personalized | 1 | 60.00 | 60.00 | 60.00 |" in table
    assert "missing from round 2 (evaluated in other rounds; the means are over the others): personalized: s02" in table
    assert "best round" not in table


def test_a_client_missing_from_the_best_round_is_named():
    s = summary_of(tiny_config(rounds=3), frame([(1, "s01", 0.5), (1, "s02", 0.5), (2, "s01", 0.95),
                                                 (3, "s01", 0.4), (3, "s02", 0.4)]))
    assert s["best_rounds"] == {"personalized": 2}
    assert s["missing"] == {"final": {}, "best": {"personalized": ["s02"]}}
    assert s["n_clients"] == {"final": {"personalized": 2}, "best": {"personalized": 1}}
    table = summary_table(s)
    assert "missing from round" not in table
    assert "missing from the best round: personalized (round 2): s02" in table


def test_a_run_that_evaluated_no_round_says_so_in_its_tasks_metrics():
    empty = pd.DataFrame(columns=["round", "client", "view", "split", "n", "n_train", "mse", "mae", "mape"])
    s = summary_of(tiny_regression_config(), empty)
    assert s["final_round"] is None and s["task"] == "regression"
    assert summary_table(s) == "no round was evaluated: no test-split MSE, MAE, MAPE (%) to show"


def test_an_older_summary_prints_without_n():
    """Summaries written before ``n_clients``, ``missing`` and ``task`` existed still print."""
    s = {"final": {"global": {"mse": 4.0, "mae": 1.5, "mape": 2.0}}, "final_round": 3, "client_weights": "test"}
    table = summary_table(s)
    assert "| view | MSE | MAE | MAPE (%) |" in table and "| global | 4 | 1.5 | 2 |" in table


def test_a_client_with_no_rows_in_the_last_round_is_named_in_process(tmp_path, monkeypatch):
    """An evaluation that returns no rows for s02 in the last round (a client gone)."""
    evaluate = SimExecutor.evaluate

    def gone_at_the_end(self, round, downs, global_msg):
        out = evaluate(self, round, downs, global_msg)
        return {c: rows for c, rows in out.items() if not (round == 2 and c == "s02")}

    monkeypatch.setattr(SimExecutor, "evaluate", gone_at_the_end)
    res = fedwear.run(tiny_config(rounds=2), tmp_path)
    s = res.summary
    views = ("generalization", "global", "personalized")  # s02 trains: not a new client
    assert s["missing"]["final"] == {v: ["s02"] for v in views}
    assert {v: s["n_clients"]["final"][v] for v in views} == {v: 5 for v in views}
    assert s["n_clients"]["final"]["new_clients"] == 2 and "new_clients" not in s["missing"]["final"]
    last = res.metrics[(res.metrics["round"] == 2) & (res.metrics["view"] == "personalized")
                       & (res.metrics["split"] == "test")]
    assert "s02" not in set(last["client"]) and len(last) == 5
    assert s["final"]["personalized"]["accuracy"] == pytest.approx(np.average(last["accuracy"], weights=last["n"]))
    assert "missing from round 2 (evaluated in other rounds; the means are over the others): " \
           "personalized: s02; generalization: s02; global: s02" in summary_table(s)


class Kill(Callback):
    """Stops a node answering once round ``after`` is over (a SuperNode killed)."""

    def __init__(self, grid, node: int, after: int) -> None:
        self.grid, self.node, self.after = grid, node, after

    def on_round(self, runner, info) -> None:
        if info.round == self.after:
            self.grid.dead.add(self.node)


@pytest.mark.extra("flower")
def test_a_node_killed_after_round_1_is_named_in_the_final_views(tmp_path, caplog):
    """The Flower engine's server side (a deployment's) on an in-process grid: a client whose node
    dies after round 1 is recorded as no reply and named missing from the final views."""
    from fedwear.callbacks import CsvSink
    from fedwear.engines.flower import GridExecutor, make_sim_client_app
    from fedwear.engines.runner import Runner
    from tests.flower_local import LocalGrid
    from tests.test_flower import roster_of

    cfg = tiny_config(rounds=2, clients_per_round=6)
    method, roster, order = roster_of(cfg)
    victim = roster.trainers[1]
    grid = LocalGrid(make_sim_client_app(cfg), len(order))
    executor = GridExecutor(grid, cfg, len(order))
    with caplog.at_level("WARNING", logger="fedwear"):
        Runner(cfg, method, roster, executor,
               [CsvSink(tmp_path), Kill(grid, 100 + order.index(victim), after=1)]).run()
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert rounds["dropped"].iloc[1] == f"{victim}:no reply"
    s = build_summary(cfg, pd.read_csv(tmp_path / "metrics.csv"), rounds, 0.0, "test")
    assert s["final_round"] == 2
    assert s["missing"]["final"] == {v: [victim] for v in ("generalization", "global", "personalized")}
    assert s["n_clients"]["final"]["personalized"] == len(roster.clients) - 1
    assert f"personalized: {victim}" in summary_table(s)
