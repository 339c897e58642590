"""The evaluation contract Meta-HAR and FedMAT need: several named fine-tuning budgets as views
of their own, a personalised state that differs from the kept one, and per-client label spaces
mapped back to the global labels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fedwear
from fedwear.callbacks import CHECKPOINT, load_checkpoint
from fedwear.config import ConfigError
from fedwear.evaluation.predictor import Predictor
from fedwear.methods import METHODS
from fedwear.methods.api import Personalized, Record
from fedwear.methods.fedavg import FedAvg
from fedwear.methods.training import model_arrays
from tests.helpers import tiny_config


class TwoBudgets(FedAvg):
    """FedAvg whose clients fine-tune the head for 1 or 2 epochs before testing (budgets e1, e2),
    and count their evaluations in the state they keep."""

    name = "two_budgets_for_test"
    budgets = ("e1", "e2")

    def personalize(self, down, state, data, seed):
        count = int(state.arrays.get("evaluations", np.zeros(1))[0]) + 1
        tuned = {}
        for budget, epochs in (("e1", 1), ("e2", 2)):
            model = self.load(down, Record())
            opt = self.optimizer(model, ("head",), Record())
            self.train(model, opt, data, seed, epochs=epochs)
            tuned[budget] = Record(model_arrays(model, ("body", "head")))
        return Personalized(tuned, keep=Record({**state.arrays, "evaluations": np.array([count])}))

    def fit(self, down, state, data, round, seed):
        up, kept = super().fit(down, state, data, round, seed)
        if "evaluations" in state.arrays:  # the count survives training
            kept.arrays["evaluations"] = state.arrays["evaluations"]
        return up, kept

    def personal_predictor(self, down, state):
        return self.predictor(self.load(down, state))

    def adapt(self, down, data, seed):
        return Personalized({b: Record() for b in self.budgets})


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(METHODS, TwoBudgets.name, TwoBudgets)


def test_each_budget_is_a_view_and_the_kept_state_changes(registered, tmp_path):
    cfg = tiny_config(method=TwoBudgets.name, rounds=3, **{"evaluation.best_metric": "personalized@e2.accuracy"})
    res = fedwear.run(cfg, tmp_path / "run")
    views = set(res.metrics["view"])
    assert {"personalized@e1", "personalized@e2", "generalization@e1", "generalization@e2",
            "new_clients@e1", "new_clients@e2", "global"} <= views
    assert "personalized" not in views
    e1 = res.metrics[res.metrics["view"] == "personalized@e1"]["macro_f1"].to_numpy()
    e2 = res.metrics[res.metrics["view"] == "personalized@e2"]["macro_f1"].to_numpy()
    assert not np.array_equal(e1, e2)  # different budgets, different models
    assert "personalized@e2" in res.summary["best"] and "personalized@e2.accuracy" in res.summary["best_rule"]
    ckpt = load_checkpoint(tmp_path / "run" / CHECKPOINT)
    counts = {c: int(s.arrays["evaluations"][0]) for c, s in ckpt["clients"].items()}
    assert counts and set(counts.values()) == {3}  # kept from one evaluation to the next


def test_budgets_through_flower_messages_equal_sim(registered, tmp_path):
    from tests.test_flower import run_on_grid

    cfg = tiny_config(method=TwoBudgets.name, rounds=2)
    run_on_grid(cfg, tmp_path / "grid")
    ref = fedwear.run(cfg, tmp_path / "sim")
    assert (tmp_path / "grid" / "metrics.csv").read_bytes() == (ref.out_dir / "metrics.csv").read_bytes()


def test_unknown_budget_view_is_one_line(registered):
    with pytest.raises(ConfigError) as err:
        tiny_config(method=TwoBudgets.name, **{"evaluation.best_metric": "personalized@e9.accuracy"})
    assert "evaluation.best_metric" in str(err.value)
    with pytest.raises(ConfigError):
        tiny_config(**{"evaluation.best_metric": "personalized@e1.accuracy"})  # fedavg has no budgets


class OwnLabels(FedAvg):
    """Each client's head scores only its own classes; the logits are one-hot on the local index
    of the true label (a perfect classifier in the client's label space)."""

    name = "own_labels_for_test"

    def personal_predictor(self, down, state):
        data = self.current
        classes = tuple(int(c) for c in np.unique(data.train.y))
        local = {c: i for i, c in enumerate(classes)}
        table = {tuple(np.round(x, 6).ravel()): y for x, y in zip(data.test.x, data.test.y, strict=True)}

        def body(x: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(len(x), len(classes))
            for i, row in enumerate(x.numpy()):
                out[i, local[table[tuple(np.round(row, 6).ravel())]]] = 1.0
            return out

        return Predictor(body, None, classes=classes)

    def personalize(self, down, state, data, seed):
        self.current = data
        return state


def test_a_client_label_space_maps_back_to_global_labels(monkeypatch, tmp_path):
    monkeypatch.setitem(METHODS, OwnLabels.name, OwnLabels)
    cfg = tiny_config(method=OwnLabels.name, rounds=1, **{"dataset.drop_classes": 1,
                                                          "evaluation.views": "[personalized]"})
    m = fedwear.run(cfg, tmp_path / "run").metrics
    test = m[m["split"] == "test"]
    assert len(test) and (test["accuracy"] == 1.0).all() and (test["auc"] == 1.0).all()


def test_task_knows_each_clients_classes_in_process_and_from_flower_nodes(tmp_path):
    from fedwear.engines.flower import GridExecutor, make_sim_client_app, roster_from_nodes
    from fedwear.methods import Task
    from fedwear.report.embeddings import load_data
    from tests.test_flower import LocalGrid, roster_of

    cfg = tiny_config(**{"dataset.drop_classes": 1})
    data = load_data(cfg)
    task = Task.of(cfg, data)
    want = {c.client_id: tuple(int(k) for k in np.unique(c.train.y)) for c in [*data.clients, *data.new_clients]}
    assert task.client_classes == want and all(len(v) == 2 for v in want.values())  # one of 3 dropped
    _, _, order = roster_of(cfg)
    executor = GridExecutor(LocalGrid(make_sim_client_app(cfg), len(order)), cfg, len(order))
    assert roster_from_nodes(executor.info).task(cfg).client_classes == want
