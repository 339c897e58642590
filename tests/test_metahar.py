"""Meta-HAR (SPECS 2.3-2.5) and FedReptile: the pairwise loss, the Reptile step, per-user heads over
the user's own classes, budgets n1-n3, and held-out users that never reach the server."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fedwear
from fedwear.callbacks import CHECKPOINT, load_checkpoint
from fedwear.methods.api import Record
from fedwear.methods.meta import CLASSES, USER, pairwise_loss
from tests.helpers import tiny_config

SETS = {"optimizer.name": "adam", "optimizer.lr": 0.001, "optimizer.persist": True, "batch_size": 16,
        "method_options.metahar.finetune_epochs": 1, "dataset.drop_classes": 1}


def test_pairwise_loss_on_hand_made_pairs():
    e = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [1.0, 0.0], [5.0, 5.0]])
    y = torch.tensor([0, 1, 0, 0, 1])
    # pairs (0, 2): cos 1, same class; (1, 3): cos 0, different classes; the odd window 4 is left out
    same = math.log1p(math.exp(10.0)) - 10.0
    different = math.log(2.0)
    assert pairwise_loss(e, y).item() == pytest.approx((same + different) / 2, rel=1e-6)
    assert pairwise_loss(e[:1], y[:1]).item() == 0.0


@pytest.mark.parametrize("method", ["metahar", "fedreptile"])
def test_reptile_step_with_sigma_one_is_fedavg_and_moves_part_of_the_way_otherwise(method):
    """Through the method's own ``aggregate``: sigma = 1 with weighted means is FedAvg; the default
    (unweighted, the code's) with sigma = 0.5 moves half way to the users' plain mean."""
    from fedwear.methods import Task, build_method
    from fedwear.report.embeddings import load_data

    def build(**options):
        cfg = tiny_config(method=method, **{f"method_options.{method}.{k}": v for k, v in options.items()})
        return build_method(Task.of(cfg, load_data(cfg)))

    fedavg = build_method(Task.of(tiny_config(), load_data(tiny_config())))
    server = fedavg.init_server()
    rng = np.random.default_rng(0)
    replies = {c: Record({k: (v + rng.normal(size=v.shape)).astype(v.dtype) for k, v in server.arrays.items()},
                         {"num_examples": n}) for c, n in (("a", 10), ("b", 30))}
    want = fedavg.aggregate(server, replies, 1)
    got = build(sigma=1.0, weighted=True).aggregate(server, replies, 1)
    for k in want.arrays:
        np.testing.assert_allclose(got.arrays[k], want.arrays[k], rtol=1e-6, atol=1e-7)
    half = build(sigma=0.5).aggregate(server, replies, 1)
    for k, v in server.arrays.items():
        mean = (replies["a"].arrays[k].astype(np.float64) + replies["b"].arrays[k]) / 2
        np.testing.assert_allclose(half.arrays[k], v + 0.5 * (mean - v), rtol=1e-5, atol=1e-6)


def test_each_user_keeps_a_head_over_its_own_classes(tmp_path):
    cfg = tiny_config(method="metahar", rounds=2, **SETS)
    res = fedwear.run(cfg, tmp_path / "run")
    views = set(res.metrics["view"])
    assert {f"personalized@n{n}" for n in (1, 2, 3)} <= views and {f"new_clients@n{n}" for n in (1, 2, 3)} <= views
    ckpt = load_checkpoint(tmp_path / "run" / CHECKPOINT)
    assert not any(k.startswith("head.") for k in ckpt["server"].arrays)  # only the embedding is shared
    from fedwear.report.embeddings import load_data

    data = load_data(cfg)
    for c in data.clients:
        state = ckpt["clients"][c.client_id]
        classes = tuple(int(k) for k in np.unique(c.train.y))
        assert tuple(state.arrays[CLASSES]) == classes and len(classes) == 2  # one of 3 dropped
        assert state.arrays[USER + "weight"].shape[0] == len(classes)
    test = res.metrics[res.metrics["split"] == "test"]
    assert test["accuracy"].between(0, 1).all()


#: FedMAT's settings of tests/test_fedmat.py (its conv3d personalisations make it slow).
FEDMAT = {"model.name": "fedmat", "model.options": {"filters": 32, "hidden": 8}, "optimizer.name": "adam",
          "dataset.drop_classes": 1, "batch_size": 16, "dataset.synthetic.channels": 6}


@pytest.mark.parametrize("method, sets", [("metahar", SETS), ("fedreptile", {}),
                                          pytest.param("fedmat", FEDMAT, marks=pytest.mark.slow)])
def test_held_out_users_never_influence_the_shared_embedding(tmp_path, monkeypatch, method, sets):
    """A new user's data, poisoned, leaves the server state bit for bit unchanged."""
    import fedwear.api as api

    cfg = tiny_config(method=method, rounds=2, **sets)
    clean = fedwear.run(cfg, tmp_path / "clean")
    real = api.load_federated

    def poisoned(dcfg, seed):
        data = real(dcfg, seed)
        for c in data.new_clients:
            c.train.x[:] = np.random.default_rng(1).normal(0, 100, c.train.x.shape).astype(np.float32)
            c.train.y[:] = 0
        return data

    monkeypatch.setattr(api, "load_federated", poisoned)
    dirty = fedwear.run(cfg, tmp_path / "dirty")
    a = load_checkpoint(clean.out_dir / CHECKPOINT)["server"]
    b = load_checkpoint(dirty.out_dir / CHECKPOINT)["server"]
    for k in a.arrays:
        assert a.arrays[k].tobytes() == b.arrays[k].tobytes(), k
    new = dirty.metrics[dirty.metrics["view"].str.startswith("new_clients")]["accuracy"].to_numpy()
    ref = clean.metrics[clean.metrics["view"].str.startswith("new_clients")]["accuracy"].to_numpy()
    assert not np.array_equal(new, ref)  # the poison reached the new users' own evaluation


def test_fedreptile_budgets_are_cumulative_epochs(tmp_path):
    cfg = tiny_config(method="fedreptile", rounds=2)
    m = fedwear.run(cfg, tmp_path / "run").metrics
    assert {"personalized@k1", "personalized@k2", "personalized@k3", "global"} <= set(m["view"])


def test_pairwise_fine_tuning_never_steps_the_users_scheduler():
    """Stage 1 uses the user's own optimiser at the rate its schedule has reached, and leaves the
    schedule where training left it (SPECS 2.4: the code steps its scheduler only in train())."""
    from fedwear.methods import Task, build_method
    from fedwear.report.embeddings import load_data

    cfg = tiny_config(method="metahar", local_epochs=2, **SETS, **{"optimizer.scheduler": "step",
                                                                   "optimizer.step_size": 1})
    data = load_data(cfg)
    m = build_method(Task.of(cfg, data))
    client = data.clients[0]
    down = m.configure(m.init_server(), client.client_id, 1)
    _, state = m.fit(down, Record(), client, 1, seed=1)
    kept = m.personalize(down, state, client, seed=2).keep
    key = "optim.model.scheduler.last_epoch"
    assert int(state.arrays[key]) == 2 and int(kept.arrays[key]) == 2
    assert any(not np.array_equal(kept.arrays[k], state.arrays[k]) for k in state.arrays if k.endswith("exp_avg"))
