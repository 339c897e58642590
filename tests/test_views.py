"""The pooled global view (FedAli's Global) and per-client best rounds (FedAli's Local)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import torch

import fedwear
from fedwear.callbacks import CHECKPOINT, load_checkpoint
from fedwear.engines.runner import pooled_test
from fedwear.evaluation.metrics import classification_metrics
from fedwear.methods import Task, build_method
from fedwear.methods.training import load_arrays
from fedwear.report.embeddings import load_data
from fedwear.summary import per_client_best
from tests.helpers import tiny_config


def test_global_pooled_equals_a_hand_pooled_computation(tmp_path):
    cfg = tiny_config(rounds=2, **{"evaluation.views": "[personalized, global, global_pooled]"})
    res = fedwear.run(cfg, tmp_path / "run")
    m = res.metrics
    pooled = m[m["view"] == "global_pooled"]
    assert list(pooled["round"]) == [1, 2] and set(pooled["client"]) == {"pooled"}
    assert (pooled["split"] == "test").all() and (pooled["n_train"] == 0).all()

    data = load_data(cfg)
    pool = pooled_test(data)
    assert int(pooled["n"].iloc[-1]) == len(pool)
    model = build_method(Task.of(cfg, data)).new_model()
    load_arrays(model, load_checkpoint(tmp_path / "run" / CHECKPOINT)["server"].arrays)
    with torch.no_grad():
        logits = model.eval()(torch.from_numpy(pool.x)).numpy()
    want = classification_metrics(pool.y, logits, cfg.evaluation.auc)
    got = pooled.iloc[-1]
    for metric in ("accuracy", "macro_f1", "auc"):
        assert abs(got[metric] - want[metric]) < 1e-6, metric
    # accuracy is also the test-weighted mean of the per-client global rows; macro-F1 is not
    per_client = m[(m["view"] == "global") & (m["round"] == 2) & (m["split"] == "test")]
    assert abs(np.average(per_client["accuracy"], weights=per_client["n"]) - got["accuracy"]) < 1e-9

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final"]["global_pooled"]["macro_f1"] == got["macro_f1"]


def test_the_per_client_global_view_adds_rows_and_changes_nothing_else(tmp_path):
    """FedAli's table adds ``global`` to FedAli's and FedAvg's views (for a claim paired by client):
    training and every other view's rows stay the same to the bit."""
    views = "[personalized, generalization, global_pooled]"
    extra = {"evaluation.personal_model": "trained", "clients_per_round": 1.0}
    without = fedwear.run(tiny_config(**extra, **{"evaluation.views": views}), tmp_path / "a")
    plus = fedwear.run(tiny_config(**extra, **{"evaluation.views": views.replace("global_pooled", "global, global_pooled")}),
                       tmp_path / "b")
    added = plus.metrics[plus.metrics["view"] == "global"]
    assert len(added) and set(added["split"]) == {"test"}
    rest = plus.metrics[plus.metrics["view"] != "global"].reset_index(drop=True)
    pd.testing.assert_frame_equal(rest, without.metrics.reset_index(drop=True))
    a, b = (pd.read_csv(tmp_path / d / "rounds.csv") for d in "ab")
    assert (b["eval_bytes_up"] > a["eval_bytes_up"]).all()  # the added rows travel up
    pd.testing.assert_frame_equal(a.drop(columns="eval_bytes_up"), b.drop(columns="eval_bytes_up"))
    ckpt = [load_checkpoint(tmp_path / d / CHECKPOINT)["server"].arrays for d in "ab"]
    assert all(np.array_equal(ckpt[0][k], ckpt[1][k]) for k in ckpt[0])


def test_no_pooled_row_without_a_global_model(tmp_path):
    cfg = tiny_config(method="fedper", rounds=1, **{"evaluation.views": "[personalized, global_pooled]"})
    m = fedwear.run(cfg, tmp_path / "run").metrics
    assert set(m["view"]) == {"personalized"}


def test_per_client_best_picks_each_clients_own_round():
    rows = []
    for r, accs in enumerate([(0.5, 0.9), (0.7, 0.6), (0.7, 0.8)], start=1):
        for c, a in zip(("a", "b"), accs, strict=True):
            rows.append({"round": r, "client": c, "view": "personalized", "split": "test", "n": 10,
                         "n_train": 5, "accuracy": a, "macro_f1": a / 2})
            rows.append({"round": r, "client": c, "view": "generalization", "split": "test", "n": 40,
                         "n_train": 5, "accuracy": r / 10, "macro_f1": r / 20})
    got = per_client_best(pd.DataFrame(rows), "personalized.accuracy", "test")
    assert got["rounds"] == {"a": 2, "b": 1}  # a: the earliest of its ties
    np.testing.assert_allclose([got["personalized"]["accuracy"][k] for k in ("mean", "std")], [0.8, 0.1])
    np.testing.assert_allclose(got["generalization"]["accuracy"]["mean"], (0.2 + 0.1) / 2)


def test_per_client_statistic_in_summary(tmp_path):
    cfg = tiny_config(method="local", rounds=3, **{"evaluation.best_statistic": "per_client",
                                                    "evaluation.views": "[personalized, generalization]"})
    fedwear.run(cfg, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    best = summary["per_client_best"]
    assert set(best["rounds"]) == {f"s0{i}" for i in (1, 2, 3, 5, 6, 7)}
    assert set(best) == {"rounds", "personalized", "generalization"}
    assert "per_client_best" in summary["best_rule"]


def test_personal_model_trained_evaluates_each_clients_locally_trained_model(tmp_path):
    """FedAli's protocol (SPECS B7): FedAvg's personalization is the model right after local
    training; without the option it is the global model. The batched engine keeps the same."""
    views = {"evaluation.views": "[personalized, global]", "clients_per_round": 1.0}
    base = fedwear.run(tiny_config(rounds=2, **views), tmp_path / "base").metrics
    got = {}
    for engine in ("sim", "batched"):
        cfg = tiny_config(rounds=2, engine=engine, **views, **{"evaluation.personal_model": "trained"})
        got[engine] = fedwear.run(cfg, tmp_path / engine).metrics
    m = got["sim"]
    test = m[m["split"] == "test"].set_index(["round", "client", "view"])
    ref = base[base["split"] == "test"].set_index(["round", "client", "view"])
    # the global view is unchanged; personalized differs from it (local training moved the model)
    assert (test.xs("global", level="view")["accuracy"] == ref.xs("global", level="view")["accuracy"]).all()
    assert (ref.xs("personalized", level="view")["accuracy"] == ref.xs("global", level="view")["accuracy"]).all()
    assert not np.allclose(test.xs("personalized", level="view")["macro_f1"],
                           test.xs("global", level="view")["macro_f1"])

    # the hand computation for one client: round 2's global model trained on its data once more
    cfg = tiny_config(rounds=2, **views, **{"evaluation.personal_model": "trained"})
    data = load_data(cfg)
    method = build_method(Task.of(cfg, data))
    ckpt = load_checkpoint(tmp_path / "sim" / CHECKPOINT)
    client = data.clients[0]
    state = ckpt["clients"][client.client_id]
    model = method.new_model()
    load_arrays(model, {k[len("trained."):]: v for k, v in state.arrays.items() if k.startswith("trained.")})
    with torch.no_grad():
        logits = model.eval()(torch.from_numpy(client.test.x)).numpy()
    want = classification_metrics(client.test.y, logits, cfg.evaluation.auc)
    row = test.loc[(2, client.client_id, "personalized")]
    assert abs(row["accuracy"] - want["accuracy"]) < 1e-9 and abs(row["macro_f1"] - want["macro_f1"]) < 1e-9
    b = got["batched"]
    np.testing.assert_allclose(b["macro_f1"].to_numpy(), m["macro_f1"].to_numpy(), atol=1e-6)


def test_batch_dependent_models_evaluate_each_window_set_in_its_own_batches(tmp_path):
    """HART's ``liteformer: code`` mixes a batch's windows (SPECS F1.3 b): a client's rows come
    from its own test windows in batches of evaluation.batch_size, as Keras' evaluate, not cut
    from the pass over the pooled test set."""
    from fedwear.engines.client import forward

    tiny_hart = {"projection_dim": 32, "patch_size": 8, "kernels": [3, 5], "head_units": 16}
    cfg = tiny_config(rounds=1, **{"model.name": "hart", "model.options": tiny_hart, "evaluation.batch_size": 4,
                                   "optimizer.lr": 1e-5, "dataset.synthetic.noise": 2.0,  # far from perfect scores
                                   "evaluation.views": "[personalized, generalization, global]"})
    m = fedwear.run(cfg, tmp_path / "run").metrics
    data = load_data(cfg)
    model = build_method(Task.of(cfg, data)).new_model()
    assert model.batch_dependent
    load_arrays(model, load_checkpoint(tmp_path / "run" / CHECKPOINT)["server"].arrays)
    client = data.clients[1]  # its test windows start mid-batch in the pooled set
    model.eval()
    own = forward(model, client.test.x, 4).numpy()
    pool = pooled_test(data)
    cut = forward(model, pool.x, 4).numpy()[len(data.clients[0].test):][:len(client.test)]
    assert not np.allclose(own, cut)  # the batch composition matters for this model
    want = classification_metrics(client.test.y, own, cfg.evaluation.auc)
    assert want["auc"] != classification_metrics(client.test.y, cut, cfg.evaluation.auc)["auc"]
    row = m[(m["client"] == client.client_id) & (m["view"] == "global") & (m["split"] == "test")].iloc[-1]
    assert abs(row["macro_f1"] - want["macro_f1"]) < 1e-9 and abs(row["auc"] - want["auc"]) < 1e-9
