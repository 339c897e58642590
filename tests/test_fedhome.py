"""FedHome: FedAvg, then personal heads trained on SMOTE-balanced representations."""

from __future__ import annotations

import csv

import numpy as np
import pandas as pd
import pytest
import torch

import fedwear
from fedwear.data import load_federated
from fedwear.data.types import ClientData, Windows
from fedwear.methods import Record, Task, build_method
from fedwear.methods.fedavg import tensors
from fedwear.methods.training import model_arrays
from tests.helpers import tiny_config

PHASES = {"rounds": 3, "method_options.fedhome.personal_rounds": 1}  # rounds 1-2 FedAvg, 3 personal
# Label skew, so that SMOTE has work to do (4 training clients, some classes with <= 5 windows).
SKEWED = {"dataset.partition": "dirichlet", "dataset.dirichlet_alpha": 1.0, "dataset.num_clients": 6,
          "dataset.synthetic.seconds_per_class": 16}


def setup(**overrides):
    cfg = tiny_config(method="fedhome", **{**PHASES, **overrides})
    data = load_federated(cfg.dataset, cfg.seed)
    return build_method(Task.of(cfg, data)), data


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fedhome")
    a = fedwear.run(tiny_config(method="fedhome", **PHASES, **SKEWED), out / "a").out_dir
    b = fedwear.run(tiny_config(method="fedhome", **PHASES, **SKEWED), out / "b").out_dir
    avg = fedwear.run(tiny_config(method="fedavg", rounds=3, **SKEWED), out / "avg").out_dir
    return a, b, avg


def rows(path, last_round):
    with open(path, newline="") as f:
        return [r for r in csv.reader(f) if r[0] == "round" or int(r[0]) <= last_round]


def test_phase_one_is_fedavg(runs):
    a, _, avg = runs
    for name in ("metrics.csv", "rounds.csv"):
        assert rows(a / name, 2) == rows(avg / name, 2)
        assert rows(a / name, 3) != rows(avg / name, 3)


def test_phase_two_trains_only_heads_on_every_client(runs):
    a, _, _ = runs
    rounds = pd.read_csv(a / "rounds.csv")
    assert rounds["n_clients"].tolist() == [3, 3, 4]  # all 4 training clients in round 3
    assert rounds["bytes_up"].iloc[-1] == 0  # nothing goes back to the server
    m = pd.read_csv(a / "metrics.csv")
    cols = ["client", "split", "accuracy", "macro_f1", "auc"]
    glob = m[m["view"] == "global"]
    r2, r3 = (glob[glob["round"] == r][cols].reset_index(drop=True) for r in (2, 3))
    pd.testing.assert_frame_equal(r2, r3)  # the global model did not change in round 3
    pers = m[(m["view"] == "personalized") & (m["round"] == 3)][cols].reset_index(drop=True)
    assert not pers.equals(r3)  # each client's own head

    method, data = setup(**{"optimizer.persist": True})
    everyone = [c.client_id for c in data.clients]
    assert method.select(method.init_server(), 2, ["s01"], everyone) == ["s01"]
    assert method.select(method.init_server(), 3, ["s01"], everyone) == everyone
    server = method.init_server()
    client = data.clients[0]
    down = method.configure(server, client.client_id, 3)
    up, state = method.fit(down, Record(), client, 3, seed=3)
    assert up.arrays == {} and method.validate_reply(down, up) is None
    assert method.validate_reply(method.configure(server, client.client_id, 2), up) is not None
    assert {k.split(".")[0] for k in state.arrays} == {"head", "optim"}
    assert all(k.startswith("optim.head.") for k in state.arrays if k.startswith("optim"))
    trained = model_arrays(method.model, ("body", "head"))
    for k, v in down.arrays.items():
        assert np.array_equal(trained[k], v) == k.startswith("body.")  # the body is frozen
    assert method.aggregate(server, {client.client_id: up}, 3) is server
    # The next personal round starts from the client's own head and optimiser.
    head_only = Record({k: v for k, v in state.arrays.items() if k.startswith("head.")})
    _, own = method.fit(down, head_only, client, 4, seed=4)
    _, fresh = method.fit(down, Record(), client, 4, seed=4)
    assert not np.array_equal(own.arrays["head.weight"], fresh.arrays["head.weight"])
    method.personal_predictor(down, state)  # evaluation: the global body, the client's head
    assert np.array_equal(model_arrays(method.model, ("head",))["head.weight"], state.arrays["head.weight"])


def imbalanced_client(data, per_class):
    """Two clients' train windows pooled, then the first ``per_class[j]`` windows of class j."""
    parts = [c.train for c in data.clients[:2]]
    pooled = Windows(*(np.concatenate([getattr(w, f) for w in parts]) for f in ("x", "y", "recording", "start")))
    idx = np.concatenate([np.flatnonzero(pooled.y == j)[:n] for j, n in enumerate(per_class)])
    rng = np.random.default_rng(0)
    pooled = pooled.take(rng.permutation(idx))
    return ClientData("mix", pooled, parts[0], parts[0].take(np.zeros(0, np.int64)))


def test_smote_balances_the_kept_classes_and_drops_the_rare_ones(monkeypatch):
    method, data = setup(local_epochs=1)
    client = imbalanced_client(data, [16, 9, 5])  # class 2 has 5 <= min_class_samples samples
    down = method.configure(method.init_server(), "mix", 3)
    model = method.load(down, Record())
    r, y = method.balanced_representations(model, client)
    assert np.bincount(y.numpy(), minlength=3).tolist() == [16, 16, 0]
    x, labels = tensors(client)
    with torch.no_grad():
        features = model.eval().features(x)
    first = sorted((0, 1), key=lambda c: np.flatnonzero(labels.numpy() == c)[0])  # order of appearance
    kept = np.concatenate([np.flatnonzero(labels.numpy() == c) for c in first])
    assert torch.equal(r[:25], features[kept])  # originals first, grouped by class
    r2, y2 = method.balanced_representations(model, client)
    assert torch.equal(r, r2) and torch.equal(y, y2)  # seeded: the same set every round

    seen = []
    loss = method.head_loss
    monkeypatch.setattr(method, "head_loss", lambda m, a, b: seen.append(b) or loss(m, a, b))
    method.fit(down, Record(), client, 3, seed=0)
    assert np.bincount(torch.cat(seen).numpy(), minlength=3).tolist() == [16, 16, 0]

    strict, _ = setup(**{"method_options.fedhome.min_class_samples": 9})
    r, y = strict.balanced_representations(model, client)  # only class 0 left: no SMOTE
    assert np.bincount(y.numpy(), minlength=3).tolist() == [16, 0, 0]


def test_deterministic(runs):
    a, b, _ = runs
    assert (a / "metrics.csv").read_bytes() == (b / "metrics.csv").read_bytes()
    assert (a / "rounds.csv").read_bytes() == (b / "rounds.csv").read_bytes()


def test_resume_across_the_phase_boundary(tmp_path):
    from fedwear.engines.runner import Callback

    class Interrupt(Callback):
        def on_round(self, runner, info):
            if info.round == 3:
                raise KeyboardInterrupt

    cfg = tiny_config(method="fedhome", rounds=4, local_epochs=1, **{
        "method_options.fedhome.personal_rounds": 2, "optimizer.persist": True})
    full = fedwear.run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, tmp_path / "cut", callbacks=[Interrupt()])
    resumed = fedwear.run(cfg, tmp_path / "cut", resume=True)
    assert (resumed.out_dir / "metrics.csv").read_bytes() == (full.out_dir / "metrics.csv").read_bytes()
