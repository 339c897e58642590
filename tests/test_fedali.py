"""FedAli (Ek et al. 2024; SPECS B4-B5): the model it requires, beta by round, the server's
weighted mean plus per-block k-means of the local prototypes, what a client keeps and is
evaluated with, and whole runs that agree across engines and repeat bit for bit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import fedwear
from fedwear.data import load_federated
from fedwear.errors import ConfigError
from fedwear.methods import Record, Task, build_method
from fedwear.methods.fedali import OWN, FedAli, kmeans_prototypes
from fedwear.methods.fedavg import TRAINED
from fedwear.methods.training import load_arrays
from fedwear.models.alp import ALP
from tests.helpers import config_for

pytestmark = pytest.mark.usefixtures("one_thread")

#: HART-ALP small enough for seconds-long runs: windows of 32 in patches of 8 (4 tokens of 32
#: channels), 2 blocks with 16 and 8 prototypes.
TINY = {"projection_dim": 32, "patch_size": 8, "kernels": [3, 5], "head_units": 16, "alp": {"prototypes": [16, 8]}}
#: The paper's training settings (SPECS B4) scaled to the tiny task: Adam, all clients every round.
SETS = {"model.name": "hart", "model.options": TINY, "optimizer.name": "adam", "optimizer.lr": 0.001,
        "clients_per_round": 1.0, "local_epochs": 1, "rounds": 2, "evaluation.personal_model": "trained"}
LOCALS = ["body.blocks.0.alp.local_prototypes", "body.blocks.1.alp.local_prototypes"]
GLOBALS = [k.replace("local", "global") for k in LOCALS]
BETAS = ["body.blocks.0.alp.beta", "body.blocks.1.alp.beta"]


def opt(name: str) -> str:
    return f"method_options.fedali.{name}"


def make_config(**overrides):
    return config_for("fedali", **{**SETS, **overrides})


def setup(**overrides) -> tuple[FedAli, object]:
    cfg = make_config(**overrides)
    data = load_federated(cfg.dataset, cfg.seed)
    return build_method(Task.of(cfg, data)), data


# ---- the model -------------------------------------------------------------------------------
def test_the_model_is_hart_with_alp_layers():
    m, _ = setup()
    layers = m.model.alp_layers()
    assert list(layers) == ["body.blocks.0.alp", "body.blocks.1.alp"]
    assert [layer.count for layer in layers.values()] == [16, 8]
    assert m.model.body.position.shape == (4, 32)  # window 32 / patch 8, D = 32
    server = m.init_server()
    assert set(LOCALS + GLOBALS + BETAS) <= set(server.arrays)
    # round 0 (SPECS B5): local and global are independent N(0, 1) draws, shared by all clients
    assert not np.array_equal(server.arrays[LOCALS[0]], server.arrays[GLOBALS[0]])


def test_alp_is_turned_on_with_the_defaults_when_the_hart_options_have_none():
    m, _ = setup(**{"model.options": {**{k: v for k, v in TINY.items() if k != "alp"}, "kernels": [3, 3, 3, 3, 3, 3]}})
    assert [layer.count for layer in m.model.alp_layers().values()] == [2048, 1024, 512, 256, 128, 64]
    assert all(float(layer.beta) == pytest.approx(0.2) and layer.gamma == 0.999 for layer in m.model.alp_layers().values())


@pytest.mark.parametrize(("sets", "says"), [
    ({"model.name": "cnn", "model.options": {"width": 8}}, "needs model.name=hart"),
    ({"model.options": {**TINY, "alp": False}}, "remove model.options.alp=false"),
])
def test_other_models_are_a_one_line_config_error(sets, says):
    with pytest.raises(ConfigError) as err:
        setup(**sets)
    assert says in str(err.value) and "\n" not in str(err.value)


# ---- beta by round -----------------------------------------------------------------------------
def test_beta_is_zero_in_the_first_round_then_the_models_beta():
    m, _ = setup()
    server = m.init_server()
    for r, beta in [(1, 0.0), (2, 0.2), (7, 0.2)]:
        down = m.configure(server, "s01", r)
        for k in BETAS:
            assert down.arrays[k].dtype == np.float32 and down.arrays[k].item() == pytest.approx(beta)
        assert m.evaluation_message(server, "s01", r).arrays[BETAS[0]] == down.arrays[BETAS[0]]
    # the server's own model (global view) holds the model's beta in every round, as the code's
    assert all(m.global_message(server).arrays[k].item() == pytest.approx(0.2) for k in BETAS)
    paper, _ = setup(**{opt("first_round_beta"): "null", "model.options": {**TINY, "alp": {**TINY["alp"], "beta": 0.4}}})
    assert paper.configure(paper.init_server(), "s01", 1).arrays[BETAS[1]].item() == pytest.approx(0.4)


def test_the_client_trains_with_the_beta_it_is_sent(monkeypatch):
    m, data = setup()
    seen = []
    original = m.train

    def spy(model, *args, **kwargs):
        seen.append([float(layer.beta) for layer in model.alp_layers().values()])
        return original(model, *args, **kwargs)

    monkeypatch.setattr(m, "train", spy)
    server = m.init_server()
    up, state = m.fit(m.configure(server, "x", 1), Record(), data.clients[0], 1, seed=3)
    m.fit(m.configure(server, "x", 2), Record(), data.clients[0], 2, seed=3)
    assert seen == [[0.0, 0.0], [pytest.approx(0.2)] * 2]
    assert up.arrays[BETAS[0]].item() == 0.0 and state.arrays[TRAINED + BETAS[0]].item() == 0.0


# ---- server: FedAvg + k-means ------------------------------------------------------------------
def fake_replies(m: FedAli, n: int = 3, seed: int = 0, same_prototypes: bool = False) -> dict[str, Record]:
    rng = np.random.default_rng(seed)
    server = m.init_server()
    replies = {}
    for i in range(n):
        arrays = {k: rng.standard_normal(a.shape).astype(a.dtype) for k, a in server.arrays.items()}
        if same_prototypes:
            arrays.update({k: server.arrays[k] + 0 for k in LOCALS})
        replies[f"c{i}"] = Record(arrays, {"num_examples": 10 * (i + 1), "loss": 0.0})
    return replies


def test_server_averages_weights_like_fedavg_and_kmeans_the_prototypes_per_block():
    m, _ = setup()
    replies = fake_replies(m)
    new = m.aggregate(m.init_server(), replies, 2)
    w = np.array([10.0, 20.0, 30.0]) / 60
    reps = [replies[f"c{i}"] for i in range(3)]
    for k, a in new.arrays.items():
        if "prototypes" in k or k.endswith(".beta"):
            continue
        expected = sum(wi * r.arrays[k].astype(np.float64) for wi, r in zip(w, reps, strict=True))
        np.testing.assert_allclose(a, expected, rtol=1e-6, atol=1e-7, err_msg=k)  # FedAvg's Eq. 1
        assert a.dtype == reps[0].arrays[k].dtype
    for local, glob, g in zip(LOCALS, GLOBALS, [16, 8], strict=True):
        assert new.arrays[local].shape == new.arrays[glob].shape == (g, 32)
        assert new.arrays[local].dtype == np.float32
        np.testing.assert_array_equal(new.arrays[local], new.arrays[glob])  # global := local := k-means
        points = np.concatenate([r.arrays[local] for r in reps])
        init = sum(wi * r.arrays[local].astype(np.float64) for wi, r in zip(w, reps, strict=True)).astype(np.float32)
        np.testing.assert_array_equal(new.arrays[local], kmeans_prototypes(points, init))
        assert not np.allclose(new.arrays[local], init, atol=1e-3)  # k-means moved the weighted mean
    assert all(new.arrays[k].item() == pytest.approx(0.2) for k in BETAS)


def test_identical_local_prototypes_come_back_unchanged():
    m, _ = setup()
    server = m.init_server()
    new = m.aggregate(server, fake_replies(m, same_prototypes=True), 3)
    for local, glob in zip(LOCALS, GLOBALS, strict=True):
        np.testing.assert_allclose(new.arrays[local], server.arrays[local], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(new.arrays[glob], new.arrays[local])


def test_kmeans_prototypes_are_the_means_of_the_final_clusters_and_repeat_bit_for_bit():
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((64, 24)).astype(np.float32) * 3
    clients = [centres + 0.1 * rng.standard_normal(centres.shape).astype(np.float32) for _ in range(12)]
    points = np.concatenate(clients)
    init = (np.mean(clients, axis=0) + 0.3 * rng.standard_normal(centres.shape)).astype(np.float32)
    a = kmeans_prototypes(points, init, seed=5)
    b = kmeans_prototypes(points, init, seed=5)
    assert a.dtype == np.float32 and a.shape == (64, 24)
    assert a.tobytes() == b.tobytes()
    # well separated: every prototype is the mean of its 12 client copies
    np.testing.assert_allclose(a, np.mean(clients, axis=0), rtol=1e-5, atol=1e-5)
    # spec check (SPECS B5 step 3): the means of sklearn's final labels
    from sklearn.cluster import KMeans

    noisy = points + rng.standard_normal(points.shape).astype(np.float32) * 2
    labels = KMeans(n_clusters=64, init=init, n_init=1, max_iter=300, tol=1e-4).fit(noisy).labels_
    c = kmeans_prototypes(noisy, init)
    for k in np.unique(labels):
        np.testing.assert_allclose(c[k], noisy[labels == k].mean(0), rtol=1e-4, atol=1e-5)
    # stopped early, sklearn's centres are one M-step behind its final labels; the code (and
    # this) takes the means of the final labels
    blob = rng.standard_normal((768, 24)).astype(np.float32)  # no cluster structure: labels keep moving
    km = KMeans(n_clusters=64, init=init, n_init=1, max_iter=1).fit(blob)
    c = kmeans_prototypes(blob, init, max_iter=1)
    assert not np.allclose(c, km.cluster_centers_, atol=1e-3)
    for k in np.unique(km.labels_):
        np.testing.assert_allclose(c[k], blob[km.labels_ == k].mean(0), rtol=1e-4, atol=1e-5)


def test_a_realistic_block_zero_repeats_bit_for_bit():
    """Bigger: 8 clients x 512 prototypes x 192 dims, prototypes that drifted apart by EMA."""
    rng = np.random.default_rng(2)
    base = rng.standard_normal((512, 192)).astype(np.float32)
    clients = [base + 0.05 * rng.standard_normal(base.shape).astype(np.float32) * rng.random((512, 1)).astype(np.float32)
               for _ in range(8)]
    points, init = np.concatenate(clients), np.mean(clients, axis=0).astype(np.float32)
    assert kmeans_prototypes(points, init).tobytes() == kmeans_prototypes(points, init).tobytes()


# ---- client ------------------------------------------------------------------------------------
def test_fit_moves_local_prototypes_only_and_keeps_the_trained_model():
    m, data = setup()
    down = m.configure(m.init_server(), "x", 2)
    up, state = m.fit(down, Record(), data.clients[0], 2, seed=4)
    assert m.validate_reply(down, up) is None
    for local, glob in zip(LOCALS, GLOBALS, strict=True):
        assert not np.array_equal(up.arrays[local], down.arrays[local])  # EMA inside the forward pass
        np.testing.assert_array_equal(up.arrays[glob], down.arrays[glob])  # never updated by clients
    kept = {k[len(TRAINED):] for k in state.arrays if k.startswith(TRAINED)}
    assert kept == set(up.arrays)  # the trained model (evaluation.personal_model: trained)
    for k in kept:
        np.testing.assert_array_equal(state.arrays[TRAINED + k], up.arrays[k])
    assert not any(k.startswith(OWN) for k in state.arrays)  # no personal prototypes by default


@pytest.mark.parametrize("personal", [False, True])
def test_personal_prototypes_start_from_the_clients_own(monkeypatch, personal):
    m, data = setup(**{opt("personal_prototypes"): personal})
    client = data.clients[1]
    server = m.init_server()
    _, state = m.fit(m.configure(server, "x", 1), Record(), client, 1, seed=1)
    starts = []
    original = m.train

    def spy(model, *args, **kwargs):
        starts.append({k: v.clone() for k, v in model.state_dict().items() if k in LOCALS + GLOBALS})
        return original(model, *args, **kwargs)

    monkeypatch.setattr(m, "train", spy)
    down = m.configure(m.aggregate(server, fake_replies(m), 1), "x", 2)
    m.fit(down, state, client, 2, seed=2)
    for k in LOCALS:
        source = state.arrays[OWN + k] if personal else down.arrays[k]
        np.testing.assert_array_equal(starts[0][k].numpy(), source)
    for k in GLOBALS:
        np.testing.assert_array_equal(starts[0][k].numpy(), down.arrays[k])


def test_clients_are_evaluated_with_their_trained_model_and_the_server_with_kmeans_prototypes():
    m, data = setup()
    client = data.clients[0]
    server = m.init_server()
    down = m.configure(server, "x", 2)
    up, state = m.fit(down, Record(), client, 2, seed=4)
    x = torch.from_numpy(client.test.x)
    pred = m.trained_predictor(state)
    with torch.no_grad():
        personal = pred(x)
    fresh = m.new_model().eval()
    load_arrays(fresh, {**down.arrays, **up.arrays})
    with torch.no_grad():
        torch.testing.assert_close(personal, fresh(x))  # its own local prototypes and beta
        glob = m.global_predictor(m.global_message(server))(x)
        assert m.trained_predictor(Record()) is None  # not trained yet: the method's predictor
    assert not torch.allclose(personal, glob)


@pytest.mark.parametrize("alp", [
    {"glu": False}, {"use_global": False}, {"use_local": False}, {"matcher": "cosine"}, {"matcher": "euclidean"},
    {"update": "soft_code"}, {"update": "soft_paper"},
])
def test_ablations_train_and_aggregate(alp):
    """Table 4's ablations (and the soft updates): a round of two clients and the server step."""
    m, data = setup(**{"model.options": {**TINY, "alp": {**TINY["alp"], **alp}}})
    server = m.init_server()
    replies = {}
    for c in data.clients[:2]:
        down = m.configure(server, c.client_id, 2)
        replies[c.client_id], _ = m.fit(down, Record(), c, 2, seed=1)
        assert m.validate_reply(down, replies[c.client_id]) is None
    new = m.aggregate(server, replies, 2)
    assert set(new.arrays) == set(server.arrays)
    has_local, has_global = alp.get("use_local", True), alp.get("use_global", True)
    assert (LOCALS[0] in new.arrays) == has_local and (GLOBALS[0] in new.arrays) == has_global
    if has_local and has_global:
        np.testing.assert_array_equal(new.arrays[LOCALS[0]], new.arrays[GLOBALS[0]])
    if not has_local:  # nothing updates the global prototypes: they stay as drawn
        np.testing.assert_allclose(new.arrays[GLOBALS[0]], server.arrays[GLOBALS[0]], rtol=1e-6)


# ---- whole runs --------------------------------------------------------------------------------
def test_runs_repeat_bit_for_bit_and_batched_equals_sim(tmp_path):
    a = fedwear.run(make_config(), tmp_path / "a")
    b = fedwear.run(make_config(), tmp_path / "b")
    c = fedwear.run(make_config(engine="batched"), tmp_path / "c")
    assert (a.out_dir / "metrics.csv").read_bytes() == (b.out_dir / "metrics.csv").read_bytes()
    assert (a.out_dir / "metrics.csv").read_bytes() == (c.out_dir / "metrics.csv").read_bytes()
    m = a.metrics
    assert set(m["round"]) == {1, 2}
    assert {"personalized", "generalization", "global", "new_clients"} <= set(m["view"])
    assert m["accuracy"].notna().all()
    # everything crosses the network: the model, both prototype sets, beta
    msg = build_method(Task.of(make_config(), load_federated(make_config().dataset, 0))).init_server()
    n_clients = pd.read_csv(a.out_dir / "rounds.csv")["n_clients"]
    assert a.summary["bytes_down"] == int(n_clients.sum()) * msg.nbytes


@pytest.mark.extra("flower")
def test_flower_messages_give_the_same_metrics_and_bytes(tmp_path):
    """The Flower engine's messages (an in-process grid, as tests/test_flower.py does for every
    method) give FedAli's in-process metrics and bytes, evaluating round 0 too."""
    from tests.test_flower import run_on_grid

    cfg = make_config(**{"evaluation.at_start": True})
    executor, _ = run_on_grid(cfg, tmp_path / "grid")
    ref = fedwear.run(cfg, tmp_path / "sim")
    assert (tmp_path / "grid" / "metrics.csv").read_bytes() == (ref.out_dir / "metrics.csv").read_bytes()
    rounds = pd.read_csv(tmp_path / "grid" / "rounds.csv")
    assert executor.bytes_down == rounds["bytes_down"].sum() == ref.summary["bytes_down"]
    assert executor.bytes_up == rounds["bytes_up"].sum() == ref.summary["bytes_up"]


def test_alp_layers_are_found_by_type():
    m, _ = setup()
    assert all(isinstance(layer, ALP) for layer in m.layers.values())
