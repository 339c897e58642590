"""The Flower engine: message mapping, malformed replies and drop-outs (in-process grid),
and equivalence with the in-process engine on Flower's simulation runtime (slow)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from tests.conftest import needs_extra

pytestmark = pytest.mark.extra("flower")
needs_extra("flower")

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict  # noqa: E402

import fedwear  # noqa: E402
from fedwear.callbacks import CsvSink  # noqa: E402
from fedwear.data import load_federated  # noqa: E402
from fedwear.engines.flower import (  # noqa: E402
    GridExecutor,
    from_content,
    make_sim_client_app,
    rows_from_content,
    rows_to_content,
    to_content,
    wire_bytes,
)
from fedwear.engines.runner import Roster, Runner  # noqa: E402
from fedwear.methods import METHODS, Record, Task, build_method  # noqa: E402
from tests.flower_local import LocalGrid  # noqa: E402
from tests.helpers import PHASES, config_for, tiny_config  # noqa: E402


def test_record_round_trip_keeps_names_dtypes_and_scalars():
    rec = Record({"body.w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(3, np.int64)},
                 {"num_examples": 12, "loss": 0.5, "tag": "x"})
    back, conf = from_content(to_content(rec, {"round": 4}))
    assert conf == {"round": 4}
    assert back.scalars == rec.scalars
    assert list(back.arrays) == list(rec.arrays)
    for k in rec.arrays:
        assert back.arrays[k].dtype == rec.arrays[k].dtype and back.arrays[k].shape == rec.arrays[k].shape
        np.testing.assert_array_equal(back.arrays[k], rec.arrays[k])
    assert wire_bytes(to_content(rec)["arrays"]) == rec.nbytes


def test_rows_round_trip():
    rows = [{"view": "global", "split": "test", "n": 5, "n_train": 9, "accuracy": 0.4, "macro_f1": 0.3, "auc": float("nan")}]
    back = rows_from_content(rows_to_content(rows))
    assert back[0]["view"] == "global" and back[0]["n"] == 5 and back[0]["n_train"] == 9 and np.isnan(back[0]["auc"])
    assert rows_from_content(rows_to_content([])) == []
    # a classification row's confusion counts travel as ints beside its metrics (not as a metric)
    counted = [{**rows[0], "confusion": (3, 1, 0, 1)}, {**rows[0], "view": "x"}, {**rows[0], "confusion": (0, 0, 2, 3)}]
    back = rows_from_content(rows_to_content(counted))
    assert [r.get("confusion") for r in back] == [(3, 1, 0, 1), None, (0, 0, 2, 3)]
    assert set(back[0]) == set(counted[0])


def roster_of(cfg) -> tuple:
    data = load_federated(cfg.dataset, cfg.seed)
    method = build_method(Task.of(cfg, data))
    roster = Roster.of(method, data)
    return method, roster, list(dict.fromkeys([*roster.trainers, *roster.clients, *roster.new_clients]))


def run_on_grid(cfg, out, **grid_kwargs):
    """The Flower server side (Runner + GridExecutor) against an in-process grid."""
    method, roster, order = roster_of(cfg)
    n = len(order)
    grid = LocalGrid(make_sim_client_app(cfg), n, **grid_kwargs)
    out.mkdir(parents=True, exist_ok=True)
    executor = GridExecutor(grid, cfg, n)
    Runner(cfg, method, roster, executor, [CsvSink(out)]).run()
    return executor, grid


#: The parts of the model that each method's paper keeps on the client: no array of theirs may
#: travel in any message (FedMAT's masks live in its ``head``, Meta-HAR's user heads in
#: ``head`` and ``user_head``).
STAY_ON_CLIENT = {
    "fedrep": ("head",), "fedper": ("head",), "protohar": ("head",), "lgfedavg": ("body",),
    "fedproto": ("body", "head"), "fedpcl": ("body", "head"), "local": ("body", "head"),
    "metahar": ("head", "user_head"), "fedmat": ("head",),
}

#: Methods whose grid test takes tens of CPU-seconds (FedMAT's conv3d fine-tuning): slow suite.
SLOW_GRID = {"fedmat"}


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW_GRID else m
                                    for m in sorted(METHODS)])
def test_grid_engine_equals_sim_and_counts_the_same_bytes(tmp_path, method):
    """Every method gives the same metrics and bytes through Flower messages (the engine of
    flower-sim and deployments, here on an in-process grid) as in-process, and what its paper
    keeps on the client never travels."""
    cfg = config_for(method, **{"evaluation.at_start": True, **PHASES.get(method, {})})
    executor, grid = run_on_grid(cfg, tmp_path / "grid")
    travelled = {name.split(".", 1)[0] for name in grid.array_names}
    assert not travelled & set(STAY_ON_CLIENT.get(method, ())), sorted(travelled)
    ref = fedwear.run(cfg, tmp_path / "sim")
    assert (tmp_path / "grid" / "metrics.csv").read_bytes() == (ref.out_dir / "metrics.csv").read_bytes()
    confusion = [tmp_path / "grid" / "confusion.csv", ref.out_dir / "confusion.csv"]  # classification only
    assert [p.exists() for p in confusion] == [ref.summary["task"] == "classification"] * 2
    if confusion[0].exists():
        assert confusion[0].read_bytes() == confusion[1].read_bytes()
    rounds = pd.read_csv(tmp_path / "grid" / "rounds.csv", keep_default_na=False)
    assert (rounds["dropped"] == "").all(), rounds["dropped"].tolist()  # every honest reply and its weight pass
    assert executor.bytes_down == rounds["bytes_down"].sum() == ref.summary["bytes_down"]
    assert executor.bytes_up == rounds["bytes_up"].sum() == ref.summary["bytes_up"]


@pytest.mark.parametrize("method", ["protohar", "metahar"])
def test_central_dp_through_flower_messages_equals_sim(tmp_path, method):
    """Central DP by parts (ProtoHAR: its parts travel as the reply's arrays) and on the mean before
    a Reptile step (Meta-HAR): the same numbers through Flower messages as in-process."""
    from fedwear.privacy import private

    cfg = config_for(method, **{"privacy.dp": "central", "privacy.noise_multiplier": 0.5})
    plain, roster, order = roster_of(cfg)
    grid = LocalGrid(make_sim_client_app(cfg), len(order))
    executor = GridExecutor(grid, cfg, len(order))
    (tmp_path / "grid").mkdir()
    Runner(cfg, private(plain, cfg), roster, executor, [CsvSink(tmp_path / "grid")]).run()
    ref = fedwear.run(cfg, tmp_path / "sim")
    assert (tmp_path / "grid" / "metrics.csv").read_bytes() == (ref.out_dir / "metrics.csv").read_bytes()
    rounds = pd.read_csv(tmp_path / "grid" / "rounds.csv", keep_default_na=False)
    assert (rounds["dropped"] == "").all(), rounds["dropped"].tolist()


def _rename(reply: Message) -> Message:
    arrays = reply.content["arrays"]
    bad = ArrayRecord({f"x.{k}": v for k, v in arrays.items()})
    return Message(RecordDict({"arrays": bad, "config": reply.content["config"]}), reply_to=_original(reply))


def _nan(reply: Message) -> Message:
    arrays = {k: a.numpy() for k, a in reply.content["arrays"].items()}
    k = next(iter(arrays))
    arrays[k] = np.full_like(arrays[k], np.inf)
    return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                               "config": reply.content["config"]}), reply_to=_original(reply))


def _shape(reply: Message) -> Message:
    arrays = {k: a.numpy() for k, a in reply.content["arrays"].items()}
    k = next(iter(arrays))
    arrays[k] = arrays[k].ravel()[:3].copy()
    return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                               "config": reply.content["config"]}), reply_to=_original(reply))


def _garbage(reply: Message) -> Message:
    return Message(RecordDict({"config": ConfigRecord({"hello": 1})}), reply_to=_original(reply))


def _original(reply: Message) -> Message:
    """A stand-in instruction so that Message(reply_to=...) builds a reply."""
    m = Message(RecordDict(), dst_node_id=reply.metadata.src_node_id, message_type="train", group_id="0")
    m.metadata.__dict__["_message_id"] = "x"
    return m


def test_malformed_replies_and_dead_nodes_are_dropped_and_logged(tmp_path, caplog):
    cfg = tiny_config(clients_per_round=6, rounds=2)
    _, roster, order = roster_of(cfg)  # node 100 + i plays order[i]
    c = roster.trainers
    node = {cid: 100 + order.index(cid) for cid in c}
    tamper = {node[c[0]]: _rename, node[c[1]]: _nan, node[c[2]]: _shape, node[c[3]]: _garbage}
    with caplog.at_level("WARNING", logger="fedwear"):
        run_on_grid(cfg, tmp_path, tamper=tamper, dead={node[c[4]]})
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert len(rounds) == 2
    dropped = rounds["dropped"].iloc[0]
    expected = [(c[0], "names differ"), (c[1], "NaN or inf"), (c[2], "shape"), (c[3], "no reply"), (c[4], "no reply")]
    for cid, why in expected:
        assert f"{cid}:" in dropped and why in dropped.split(f"{cid}:")[1].split(";")[0], dropped
    assert c[5] not in dropped
    text = caplog.text
    assert f"no reply from node {node[c[4]]}" in text and "unreadable reply" in text
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    assert set(metrics["round"]) == {1, 2} and np.isfinite(metrics["accuracy"]).all()


def test_client_state_lives_in_context_state(tmp_path):
    cfg = tiny_config(method="local", rounds=2)
    _, grid = run_on_grid(cfg, tmp_path)
    ctx: Context = grid.contexts[100]  # a training client (trainers come first)
    assert "fedwear.state.arrays" in ctx.state
    assert any(k.startswith("head.") for k in ctx.state["fedwear.state.arrays"])


#: What Ray adds to the grid test above is the process boundary (client code in Ray actors, its
#: state carried in Context across them), so one method of each kind runs there: FedAvg with
#: central DP (Flower's DP wrapper around FedAvg), PCFedH (regression, a clustering phase) and
#: Meta-HAR (personal heads kept across rounds, meta-test users). Plain FedAvg on Ray, on a
#: cluster, is tests/test_cluster.py's; every method's messages are the grid test's.
RAY_METHODS = ["fedavg+dp", "pcfedh", "metahar"]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("method", RAY_METHODS)
def test_flower_sim_equals_sim(tmp_path, method):
    name = method.split("+")[0]
    sets = {"dataset.cache_dir": str(tmp_path / "cache"), **PHASES.get(name, {})}
    if method.endswith("+dp"):
        sets.update({"privacy.dp": "central", "privacy.noise_multiplier": 0.5})
    sim = fedwear.run(config_for(name, **sets), tmp_path / "sim")
    flw = fedwear.run(config_for(name, engine="flower-sim", **sets), tmp_path / "flower")
    assert flw.summary["engine"] == "flower-sim"
    assert os.environ["RAY_worker_niceness"] == "0"  # noqa: SIM112 (Ray reads this case); its 15 starves the actors
    a, b = sim.metrics, flw.metrics
    assert a[["round", "client", "view", "split", "n"]].equals(b[["round", "client", "view", "split", "n"]])
    metrics = [m for m in ("accuracy", "macro_f1", "auc", "mse", "mae", "mape") if m in a]
    assert len(metrics) == 3
    for m in metrics:
        np.testing.assert_allclose(a[m].to_numpy(), b[m].to_numpy(), atol=1e-6, equal_nan=True)
    assert sim.summary["bytes_up"] == flw.summary["bytes_up"]
    assert sim.summary["bytes_down"] == flw.summary["bytes_down"]
    a, b = sim.out_dir / "confusion.csv", flw.out_dir / "confusion.csv"  # classification runs only
    assert a.exists() == b.exists() == (sim.summary["task"] == "classification")
    if a.exists():
        assert a.read_bytes() == b.read_bytes()


def server_after(cfg, out) -> Record:
    """The server state a run of ``cfg`` ends with, through the in-process grid (central DP
    wrapped as ``fedwear.run`` wraps it; SecAgg+ when the config asks)."""
    from fedwear.callbacks import CHECKPOINT, Checkpointer, load_checkpoint
    from fedwear.privacy import private

    method, roster, order = roster_of(cfg)
    method = private(method, cfg)
    grid = LocalGrid(make_sim_client_app(cfg), len(order))
    out.mkdir(parents=True, exist_ok=True)
    executor = GridExecutor(grid, cfg, len(order))
    executor.reply_spec = method.reply_spec
    Runner(cfg, method, roster, executor, [CsvSink(out), Checkpointer(out, 1)]).run()
    return load_checkpoint(out / CHECKPOINT)["server"]


def test_secure_aggregation_matches_plain_mean(tmp_path):
    """SecAgg+ through the in-process grid: the server state matches FedAvg's to quantisation error."""
    plain = server_after(tiny_config(rounds=2), tmp_path / "plain")
    secure = server_after(tiny_config(rounds=2, engine="flower-sim", **{"flower.secagg.enabled": True}), tmp_path / "sec")
    for k, v in plain.arrays.items():
        np.testing.assert_allclose(secure.arrays[k], v, atol=5e-4)  # SecAgg+ quantisation
    rounds = pd.read_csv(tmp_path / "sec" / "rounds.csv")
    assert rounds["dropped"].isna().all() and (rounds["n_clients"] == 3).all()


@pytest.mark.parametrize("method", ["fedavg", "protohar", "metahar"])
def test_central_dp_under_secure_aggregation_matches_dp_alone(tmp_path, method):
    """SecAgg+ under central DP: on the mean (FedAvg), by parts (ProtoHAR: the server gets the
    mean of the clipped parts, never one client's) and before a Reptile step (Meta-HAR). The
    server adds the same noise after unmasking, so the state matches DP without SecAgg+ to
    quantisation error, and no reply is dropped."""
    dp = {"privacy.dp": "central", "privacy.noise_multiplier": 0.5, "rounds": 2, **PHASES.get(method, {})}
    alone = server_after(config_for(method, **dp), tmp_path / "dp")
    secure = server_after(config_for(method, engine="flower-sim", **{"flower.secagg.enabled": True}, **dp),
                          tmp_path / "sec")
    assert alone.arrays.keys() == secure.arrays.keys()
    for k, v in alone.arrays.items():
        np.testing.assert_allclose(secure.arrays[k], v, atol=5e-4, err_msg=k)
    rounds = pd.read_csv(tmp_path / "sec" / "rounds.csv", keep_default_na=False)
    assert (rounds["dropped"] == "").all() and (rounds["n_clients"] == 3).all(), rounds.to_dict("list")
