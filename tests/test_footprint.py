"""The memory a method holds while it trains (FedAli's Table 3 column): counted once per storage,
the model plus each method's anchors, reported per round in rounds.csv."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import fedwear
from fedwear.data import load_federated
from fedwear.engines.client import TRAINING_BYTES, ClientRuntime
from fedwear.methods import Record, Task, build_method
from fedwear.methods.footprint import tensor_bytes
from tests.helpers import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def model_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def fitted(method_name: str):
    cfg = tiny_config(method=method_name)
    data = load_federated(cfg.dataset, cfg.seed)
    method = build_method(Task.of(cfg, data))
    client = method.training_clients(data)[0]
    runtime = ClientRuntime(method, client, cfg)
    up, _ = runtime.fit(method.configure(method.init_server(), client.client_id, 1), Record(), 1)
    return method, up


def test_each_storage_counts_once_and_numpy_arrays_not_at_all():
    class Holder:
        pass

    h = Holder()
    h.weights = torch.zeros(10)  # 40 bytes
    h.view = h.weights[:5]  # the same storage
    h.copies = [torch.zeros(2, dtype=torch.float64), {"again": h.weights}]  # 16 new bytes
    h.numbers = np.zeros(1000)  # the engine's copies: not a client's tensors
    assert tensor_bytes(h) == 56


def test_fedavg_holds_its_model_and_fedprox_the_global_model_beside_it():
    fedavg, up = fitted("fedavg")
    size = model_bytes(fedavg.model)
    assert up.scalars[TRAINING_BYTES] == size
    _, up = fitted("fedprox")
    assert 2 * size <= up.scalars[TRAINING_BYTES] < 2 * size + 64  # w and w_global (+ the weights vector)


def test_moon_holds_three_models():
    moon, up = fitted("moon")
    assert up.scalars[TRAINING_BYTES] == 3 * model_bytes(moon.model)  # local, global and previous


@pytest.mark.parametrize("sets", [{}, {"engine": "batched", "optimizer.name": "adam"},
                                  pytest.param({"privacy.dp": "central"}, marks=pytest.mark.extra("flower"))], ids=str)
def test_rounds_csv_reports_the_largest_client_footprint(tmp_path, sets):
    cfg = tiny_config(method="moon", rounds=2, **sets)  # batched with Adam: MOON trains one by one
    fedwear.run(cfg, tmp_path / "run")
    rounds = pd.read_csv(tmp_path / "run" / "rounds.csv")
    method = build_method(Task.of(cfg, load_federated(cfg.dataset, cfg.seed)))
    size = model_bytes(method.model)  # local, global and previous model
    assert ((rounds["training_bytes"] >= 3 * size) & (rounds["training_bytes"] < 3 * size + 64)).all()
