"""A client's evaluation rows are checked before they count: views and splits the run evaluates,
``n`` and ``n_train`` as the client declared its splits, metrics of the task in their range, and
confusion counts that give the reported accuracy and macro-F1. A client whose rows fail is left
out of that round's metrics and named in rounds.csv's ``rejected``."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import fedwear
from fedwear.config import load_config
from fedwear.engines.client import CONFUSION, ClientRuntime
from fedwear.engines.rows import RowRules, rows_problem
from tests.helpers import tiny_config

RULES = RowRules(kind="classification", num_classes=2, views=frozenset({"personalized", "global", "generalization",
                                                                       "global_pooled", "new_clients"}),
                 budgets=("n1",), splits=frozenset({"test"}), sizes={"a": (20, 10, 0), "b": (30, 6, 0)},
                 pooled_test=16)


def row(**changes) -> dict:
    """A true row of client a: 10 test windows, 8 right (confusion [[5, 1], [1, 3]])."""
    base = {"view": "personalized", "split": "test", "n": 10, "n_train": 20, "accuracy": 0.8,
            "macro_f1": float(np.mean([2 * 5 / 12, 2 * 3 / 8])), "auc": 0.9, CONFUSION: (5, 1, 1, 3)}
    return {**base, **changes}


def test_a_true_row_passes():
    assert rows_problem([row(), row(view="global")], "a", False, RULES, set()) is None
    pooled = row(view="global_pooled", n=16, n_train=0, **{CONFUSION: (8, 2, 2, 4)}, accuracy=0.75,
                 macro_f1=float(np.mean([2 * 8 / 20, 2 * 4 / 12])))
    assert rows_problem([pooled], "a", False, RULES, set()) is None
    empty = row(n=0, n_train=30, accuracy=float("nan"), macro_f1=float("nan"), auc=float("nan"),
                **{CONFUSION: (0, 0, 0, 0)})
    no_test = RowRules(**{**RULES.__dict__, "sizes": {"b": (30, 0, 0)}})
    assert rows_problem([empty], "b", False, no_test, set()) is None
    assert "metrics of an empty split must be NaN" in rows_problem([{**empty, "accuracy": 1.0}], "b", False, no_test,
                                                                   set())


@pytest.mark.parametrize(("rows", "says"), [
    ([row(accuracy=7.0)], "accuracy=7.0: outside [0, 1]"),
    ([row(auc=-0.1)], "auc=-0.1: outside [0, 1]"),
    ([row(accuracy=float("inf"))], "accuracy=inf: outside"),
    ([row(accuracy="high")], "accuracy='high': not a number"),
    ([row(accuracy=1.0)], "accuracy=1.0, but its confusion counts give 0.8"),
    ([row(macro_f1=1.0)], "macro_f1=1.0, but its confusion counts give"),
    ([row(n=10**9)], "n=1000000000, but the client's test split has 10 windows"),
    ([row(n_train=10**9)], "n_train=1000000000, but the client has 20 train windows"),
    ([row(n=-1)], "not whole numbers >= 0"),
    ([row(n=2.5)], "not whole numbers >= 0"),
    ([row(**{CONFUSION: (5, 1, 1, 4)})], "confusion counts sum to 11, not n=10"),
    ([row(**{CONFUSION: (5, 1, 1)})], "expected 4 (num_classes squared)"),
    ([row(**{CONFUSION: (6, 1, 1, -1)})], "not whole numbers >= 0"),
    ([{k: v for k, v in row().items() if k != CONFUSION}], "confusion counts: expected 4"),
    ([row(loss=0.1)], "expected ['accuracy', 'macro_f1', 'auc']"),
    ([{k: v for k, v in row().items() if k != "auc"}], "expected ['accuracy', 'macro_f1', 'auc']"),
    ([row(), row()], "reported twice"),
    ([row(view="new_clients")], "not a view and split this run evaluates for a training client"),
    ([row(view="personalized@n9")], "not a view and split"),
    ([row(split="train")], "not a view and split"),
    ([row(view="global;x:y")], "row 'global,x.y'/'test'"),
    ([row(view=3)], "view and split must be text"),
    ([row(view="generalization")], "n=10, but the client's test split has 16 windows"),
])
def test_a_forged_row_is_named(rows, says):
    why = rows_problem(rows, "a", False, RULES, set())
    assert why is not None and says in why, why


def test_a_new_client_reports_only_new_client_views_and_one_pooled_row_a_round():
    assert "for a new client" in rows_problem([row()], "a", True, RULES, set())
    assert rows_problem([row(view="new_clients@n1")], "a", True, RULES, set()) is None
    pooled = row(view="global_pooled", n=16, n_train=0, **{CONFUSION: (8, 2, 2, 4)}, accuracy=0.75,
                 macro_f1=float(np.mean([2 * 8 / 20, 2 * 4 / 12])))
    assert "reported twice" in rows_problem([pooled], "b", False, RULES, {"test"})


def test_regression_rows_have_their_own_range_and_mse_at_least_mae_squared():
    rules = RowRules("regression", 0, frozenset({"personalized", "last_value"}), (), frozenset({"test"}),
                     {"a": (20, 10, 0)}, 10)
    good = {"view": "personalized", "split": "test", "n": 10, "n_train": 20, "mse": 4.0, "mae": 1.5, "mape": 2.0}
    assert rows_problem([good], "a", False, rules, set()) is None
    assert rows_problem([{**good, "mse": float("inf")}], "a", False, rules, set()) is None  # a diverged model
    assert "mse=1.0 below mae squared" in rows_problem([{**good, "mse": 1.0}], "a", False, rules, set())
    assert "mae=-1.0: outside [0, inf]" in rows_problem([{**good, "mae": -1.0}], "a", False, rules, set())
    assert "regression row" in rows_problem([{**good, CONFUSION: (1,)}], "a", False, rules, set())


#: What client s02 reports at each round instead of its true rows.
FORGE = {1: lambda r: {**r, "accuracy": 7.0}, 2: lambda r: {**r, "n": 10**9},
         3: lambda r: {**r, "accuracy": 1.0, "macro_f1": 1.0}}


def test_forged_rows_are_refused_named_and_never_averaged(tmp_path, monkeypatch):
    honest = fedwear.run(tiny_config(), tmp_path / "honest")
    true_evaluate = ClientRuntime.evaluate

    def forging(self, down, state, global_msg, round, new):
        rows, keep = true_evaluate(self, down, state, global_msg, round, new)
        if self.data.client_id == "s02":
            rows = [FORGE[round](r) for r in rows]
        return rows, keep

    monkeypatch.setattr(ClientRuntime, "evaluate", forging)
    res = fedwear.run(tiny_config(), tmp_path / "forged")
    rounds = pd.read_csv(tmp_path / "forged" / "rounds.csv", keep_default_na=False)
    assert rounds["rejected"].str.startswith("s02:").all(), rounds["rejected"].tolist()
    for r, says in ((1, "accuracy=7.0: outside [0, 1]"), (2, "n=1000000000, but the client's test split"),
                    (3, "accuracy=1.0, but its confusion counts give")):
        assert says in rounds.loc[rounds["round"] == r, "rejected"].item()
    assert "s02" not in set(res.metrics["client"])
    kept = honest.metrics[honest.metrics["client"] != "s02"].reset_index(drop=True)
    pd.testing.assert_frame_equal(res.metrics.reset_index(drop=True), kept)  # the others' rows, untouched
    summary = json.loads((tmp_path / "forged" / "summary.json").read_text())
    assert summary["rejected_evaluations"] == {"1": ["s02"], "2": ["s02"], "3": ["s02"]}
    assert summary["evaluated_by"].startswith("fedwear's own evaluation")
    assert "rows of client s02 refused" in (tmp_path / "forged" / "run.log").read_text()


def test_a_deployment_summary_says_its_numbers_are_the_nodes_own_reports():
    from fedwear.summary import EVALUATED_BY, build_summary

    cfg = load_config(data={"method": "fedavg", "engine": "flower", "dataset": {"name": "synthetic"}})
    metrics = pd.DataFrame(columns=["round", "client", "view", "split", "n", "n_train", "accuracy", "macro_f1", "auc"])
    rounds = pd.DataFrame({"round": [1], "bytes_up": [0], "bytes_down": [0], "eval_bytes_up": [0],
                           "eval_bytes_down": [0], "aggregated": [1], "rejected": ["s03:row 'x'/'test': bad"]})
    summary = build_summary(cfg, metrics, rounds, 0.0, "0")
    assert summary["evaluated_by"] == EVALUATED_BY["deployment"]
    assert summary["rejected_evaluations"] == {"1": ["s03"]}
