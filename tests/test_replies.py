"""A client's reply weight (``num_examples``) is checked before aggregation: a missing,
non-finite, fractional, non-positive or oversized weight leaves that reply out under its
client's name, in-process and through Flower messages (the path of flower-sim and deployments)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fedwear
from fedwear.data import load_federated
from fedwear.engines.runner import Roster, reply_problem
from fedwear.methods import Task, build_method
from fedwear.methods.api import Record
from fedwear.methods.fedavg import FedAvg
from tests.helpers import tiny_config


def reply(**scalars) -> Record:
    return Record({"w": np.zeros(2, np.float32)}, scalars)


@pytest.mark.parametrize(("scalars", "says"), [
    ({}, "lacks the scalar 'num_examples'"),
    ({"num_examples": float("nan")}, "is nan, not finite"),
    ({"num_examples": np.float32("inf")}, "is inf, not finite"),
    ({"num_examples": 2.5}, "is 2.5, not a whole number"),
    ({"num_examples": 0}, "is 0, not positive"),
    ({"num_examples": -3}, "is -3, not positive"),
    ({"num_examples": 1e12}, "above the client's 24 train windows"),
    ({"num_examples": 25}, "is 25, above the client's 24 train windows"),
    ({"num_examples": True}, "True (bool), not a number"),
    ({"num_examples": "12"}, "'12' (str), not a number"),
    ({"num_examples": [12]}, "[12] (list), not a number"),
    ({"num_examples": 12, "loss": "low"}, "scalar 'loss' is 'low'"),
    ({"num_examples": 12, "training_bytes": float("nan")}, "scalar 'training_bytes' is nan"),
    ({"num_examples": 12, "training_bytes": -1}, "scalar 'training_bytes' is -1"),
])
def test_a_bad_weight_is_named(scalars, says):
    why = reply_problem(reply(**scalars), train_size=24)
    assert why is not None and says in why, why
    if "num_examples" in why and "lacks" not in why:
        assert "expected a whole number of train windows, 1 to 24" in why


@pytest.mark.parametrize("weight", [1, 24, 24.0, np.int64(7), np.float32(3.0)])
def test_a_whole_weight_up_to_the_train_size_passes(weight):
    assert reply_problem(reply(num_examples=weight, loss=float("nan"), training_bytes=0), train_size=24) is None


def test_without_a_known_train_size_any_whole_positive_weight_passes():
    assert reply_problem(reply(num_examples=10**12), train_size=None) is None
    assert "at least 1" in reply_problem(reply(num_examples=0), train_size=None)


def test_the_roster_knows_each_training_clients_train_size():
    """In-process engines bound the weight by the train split; Centralized's one pooled client
    by the pooled train windows of every client."""
    for method in ("fedavg", "centralized"):
        cfg = tiny_config(method=method)
        data = load_federated(cfg.dataset, cfg.seed)
        roster = Roster.of(build_method(Task.of(cfg, data)), data)
        if method == "fedavg":
            assert roster.train_sizes == {c.client_id: len(c.train) for c in data.clients}
        else:
            assert roster.train_sizes == {"pooled": sum(len(c.train) for c in data.clients)}


#: Client -> the weight its replies carry (``None``: no weight at all).
BAD = {"s01": float("nan"), "s02": None, "s03": 1e12}


class BadWeight(FedAvg):
    """FedAvg whose clients in ``BAD`` send a broken weight, every round."""

    name = "badweight"

    def fit(self, down, state, data, round, seed):
        up, st = super().fit(down, state, data, round, seed)
        if data.client_id in BAD:
            scalars = {k: v for k, v in up.scalars.items() if k != "num_examples"}
            if BAD[data.client_id] is not None:
                scalars["num_examples"] = BAD[data.client_id]
            up = Record(up.arrays, scalars)
        return up, st


def assert_left_out_every_round(rounds: pd.DataFrame, why: dict[str, str]) -> None:
    """Every round's ``dropped`` names exactly the clients of ``why``, each for the reason given."""
    for dropped in rounds["dropped"]:
        named = dict(part.split(":", 1) for part in dropped.split(";"))
        assert set(named) == set(why), dropped
        for cid, reason in why.items():
            assert reason in named[cid], (cid, named[cid])


def assert_bad_clients_named(rounds: pd.DataFrame, log: str) -> None:
    """Each bad client is left out every round for its weight, and no honest one ever is (a NaN
    global model would have every honest reply dropped from round 2 on)."""
    assert_left_out_every_round(rounds, {"s01": "'num_examples' is nan, not finite",
                                         "s02": "lacks the scalar 'num_examples'", "s03": "above the client's"})
    for cid in BAD:
        assert f"client {cid} left out of aggregation: " in log
    assert rounds["aggregated"].all()


def test_bad_weights_are_left_out_in_process(tmp_path, monkeypatch):
    from fedwear import methods

    monkeypatch.setitem(methods.METHODS, "badweight", BadWeight)
    res = fedwear.run(tiny_config(method="badweight", clients_per_round=6, rounds=2), tmp_path)
    assert_bad_clients_named(pd.read_csv(tmp_path / "rounds.csv"), (tmp_path / "run.log").read_text())
    assert np.isfinite(res.metrics["accuracy"]).all()


@pytest.mark.parametrize("method", ["centralized", "local", "fedproto",
                                    pytest.param("fedavg+dp", marks=pytest.mark.extra("flower"))])
def test_honest_weights_pass(tmp_path, method):
    """Methods that do not weight by train windows (Local, FedProto), the pooled client of
    Centralized, and central DP's weight 1 are accepted as they are."""
    sets = {"privacy.dp": "central", "privacy.noise_multiplier": 0.5} if method.endswith("+dp") else {}
    fedwear.run(tiny_config(method=method.split("+")[0], rounds=1, **sets), tmp_path)
    rounds = pd.read_csv(tmp_path / "rounds.csv", keep_default_na=False)
    assert (rounds["dropped"] == "").all(), rounds["dropped"].tolist()


@pytest.mark.extra("flower")
def test_bad_weights_are_left_out_through_flower_messages(tmp_path, caplog):
    """The Flower engine's server side (flower-sim's and a deployment's) on an in-process grid,
    with the deployment's roster: the train sizes the nodes reported when queried."""
    from flwr.app import ConfigRecord, Message, RecordDict

    from fedwear.callbacks import CsvSink
    from fedwear.engines.flower import GridExecutor, make_sim_client_app, roster_from_nodes
    from fedwear.engines.runner import Runner
    from tests.flower_local import LocalGrid
    from tests.test_flower import _original, roster_of

    cfg = tiny_config(clients_per_round=6, rounds=2)
    method, local, order = roster_of(cfg)

    def weigh(value):
        def tamper(msg: Message) -> Message:
            conf = {k: v for k, v in msg.content["config"].items() if k != "s.num_examples"}
            if value is not None:
                conf["s.num_examples"] = value
            return Message(RecordDict({"arrays": msg.content["arrays"], "config": ConfigRecord(conf)}),
                           reply_to=_original(msg))
        return tamper

    grid = LocalGrid(make_sim_client_app(cfg), len(order),
                     tamper={100 + order.index(c): weigh(w) for c, w in BAD.items()})
    executor = GridExecutor(grid, cfg, len(order))
    roster = roster_from_nodes(executor.info)
    assert roster.train_sizes == local.train_sizes
    (tmp_path / "grid").mkdir()
    with caplog.at_level("WARNING", logger="fedwear"):
        Runner(cfg, method, roster, executor, [CsvSink(tmp_path / "grid")]).run()
    assert_bad_clients_named(pd.read_csv(tmp_path / "grid" / "rounds.csv"), caplog.text)
    assert np.isfinite(pd.read_csv(tmp_path / "grid" / "metrics.csv")["accuracy"]).all()


#: Client -> how it poisons every array of its replies.
POISON = {"s01": lambda a: np.full(a.shape, complex("nan+nanj")), "s02": lambda a: np.full(a.shape, 2**40, np.int64),
          "s03": lambda a: np.full(a.shape, "x", object)}


class Poisoner(FedAvg):
    """FedAvg whose clients in ``POISON`` send arrays of the right names and shapes but a wrong type."""

    name = "poisoner"

    def fit(self, down, state, data, round, seed):
        up, st = super().fit(down, state, data, round, seed)
        if data.client_id in POISON:
            up = Record({k: POISON[data.client_id](a) for k, a in up.arrays.items()}, up.scalars)
        return up, st


def test_replies_of_a_wrong_type_are_left_out_and_the_model_stays_the_honest_ones(tmp_path, monkeypatch):
    """Complex NaN passed a NaN check made only for floats, and int64 2**40 arrays became the model;
    both, and object arrays, are left out under their client's name, every round."""
    from fedwear import methods

    monkeypatch.setitem(methods.METHODS, "poisoner", Poisoner)
    res = fedwear.run(tiny_config(method="poisoner", clients_per_round=6, rounds=2), tmp_path)
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert_left_out_every_round(rounds, {"s01": "dtype complex128, not a real number type",
                                         "s02": "dtype int64, expected floating point as sent",
                                         "s03": "dtype object, not a real number type"})
    own = res.metrics[res.metrics["view"] == "personalized"]
    assert np.isfinite(own["accuracy"]).all() and own.loc[own["round"] == 2, "accuracy"].mean() > 0.4
