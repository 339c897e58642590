"""The Flower engine: the same methods and round loop on Flower's runtimes.

The server side is fedwear's own round loop (:class:`~fedwear.engines.runner.Runner`) running
inside a Flower ``ServerApp`` with a :class:`GridExecutor`, which turns "train these clients"
into Flower ``Message``s. The client side is a ``ClientApp`` whose handlers run the same
:class:`~fedwear.engines.client.ClientRuntime` as the in-process engine, with the client
state in ``Context.state``. A :class:`~fedwear.methods.api.Record` maps 1:1 to an
``ArrayRecord`` (arrays) + ``ConfigRecord`` (scalars).

``engine: flower-sim`` runs on Flower's simulation runtime (Ray); ``fedwear.flower_app``
holds the apps for a real deployment (SuperLink + SuperNodes).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedwear.config import RunConfig
from fedwear.engines.client import CONFUSION, ClientRuntime, EvalCache, Row, split_sizes
from fedwear.engines.process import choose_threads, prepare_process
from fedwear.engines.runner import Callback, Roster, Runner, pooled_test, test_slices
from fedwear.engines.secagg import secagg_train, secure_mean
from fedwear.errors import FedwearError
from fedwear.methods import Method, Record

log = logging.getLogger("fedwear")

ROW_COUNTS = ("n", "n_train")


def _flwr():
    try:
        import flwr.app as fa
    except ImportError:
        raise FedwearError("the Flower engine needs flwr: pip install 'fedwear[flower]'") from None
    return fa


# ---- Record <-> Flower records ---------------------------------------------------------------
def to_content(record: Record, config: dict | None = None, prefix: str = "") -> dict:
    """``{prefix}arrays`` (ArrayRecord) and ``{prefix}config`` (scalars + engine config)."""
    fa = _flwr()
    # np.require keeps 0-d arrays 0-d (np.ascontiguousarray returns at least 1-d)
    arrays = fa.ArrayRecord({k: fa.Array(np.require(v, requirements="C")) for k, v in record.arrays.items()})
    scalars = {f"s.{k}": _scalar(v) for k, v in record.scalars.items()}
    return {f"{prefix}arrays": arrays, f"{prefix}config": fa.ConfigRecord({**scalars, **(config or {})})}


def from_content(content, prefix: str = "") -> tuple[Record, dict]:
    arrays = {k: a.numpy() for k, a in content[f"{prefix}arrays"].items()}
    cfg = dict(content[f"{prefix}config"])
    scalars = {k[2:]: v for k, v in cfg.items() if k.startswith("s.")}
    return Record(arrays, scalars), {k: v for k, v in cfg.items() if not k.startswith("s.")}


def _scalar(v):
    if isinstance(v, bool | str | int | float):
        return v
    if isinstance(v, np.integer):
        return int(v)
    return float(v)


def wire_bytes(array_record) -> int:
    """Payload bytes of an ArrayRecord (shapes x itemsizes, without the npy headers)."""
    return int(sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in array_record.values()))


def rows_to_content(rows: list[Row]) -> dict:
    """Evaluation rows as Flower records: ids as strings, counts as ints, every metric (the
    task's: accuracy... or mse...) as floats, and a classification row's confusion counts
    (:data:`~fedwear.engines.client.CONFUSION`) as ints, all rows' concatenated with each
    row's length."""
    fa = _flwr()
    metrics = [k for k in (rows[0] if rows else {}) if k not in ("view", "split", CONFUSION, *ROW_COUNTS)]
    content = {
        "rows": fa.ConfigRecord({"view": [str(r["view"]) for r in rows] or [""],
                                 "split": [str(r["split"]) for r in rows] or [""]}),
        "metrics": fa.MetricRecord({**{k: [int(r[k]) for r in rows] or [0] for k in ROW_COUNTS},
                                    **{m: [float(r[m]) for r in rows] for m in metrics}}),
        "count": fa.MetricRecord({"rows": len(rows)}),
    }
    if any(CONFUSION in r for r in rows):  # Flower lists are not empty: a row without counts has size 0
        cells = [int(c) for r in rows for c in r.get(CONFUSION, ())]
        content["confusion"] = fa.MetricRecord({"size": [len(r.get(CONFUSION, ())) for r in rows],
                                                "counts": cells or [0]})
    return content


def rows_from_content(content) -> list[Row]:
    n = int(content["count"]["rows"])
    rows, met = content["rows"], content["metrics"]
    out = [
        {"view": rows["view"][i], "split": rows["split"][i], **{k: int(met[k][i]) for k in ROW_COUNTS},
         **{m: float(met[m][i]) for m in met if m not in ROW_COUNTS}}
        for i in range(n)
    ]
    if "confusion" in content:
        sizes, cells, at = content["confusion"]["size"], content["confusion"]["counts"], 0
        for row, size in zip(out, sizes, strict=True):
            if size:
                row[CONFUSION] = tuple(int(c) for c in cells[at : at + size])
            at += size
    return out


# ---- client side ------------------------------------------------------------------------------
@dataclass
class ClientSlot:
    client_id: str
    trainer: ClientRuntime | None  # None: this node never trains (held-out client)
    evaluator: ClientRuntime | None  # None: never evaluated (Centralized's pooled client)
    new: bool
    dims: tuple  # window, channels, classes, task kind, target shift, target scale
    classes: tuple[int, ...] = ()  # this client's own classes (its train labels)


def build_slots(cfg: RunConfig, with_pooled_test: bool) -> tuple[list[ClientSlot], Roster]:
    """Every client of the run in roster order (partition id = index), from the data on this node."""
    from fedwear.data import load_federated
    from fedwear.methods import Task, build_method
    from fedwear.privacy import private

    data = load_federated(cfg.dataset, cfg.dataset.seed if cfg.dataset.seed is not None else cfg.seed)
    method = private(build_method(Task.of(cfg, data)), cfg)
    if cfg.threads is None:  # as fedwear.run chooses them
        choose_threads(getattr(method, "model", None), data.window, len(data.channels), cfg.batch_size)
    roster = Roster.of(method, data)
    pooled = pooled_test(data) if with_pooled_test and data.clients else None
    trainers = {c.client_id: ClientRuntime(method, c, cfg) for c in method.training_clients(data)}
    shared = EvalCache()  # per process: a Ray actor plays many clients
    slices = test_slices(data)
    evaluated = {c.client_id: ClientRuntime(method, c, cfg, pooled, shared, slices[c.client_id]) for c in data.clients}
    evaluated.update({c.client_id: ClientRuntime(method, c, cfg) for c in data.new_clients})
    order = list(dict.fromkeys([*roster.trainers, *roster.clients, *roster.new_clients]))
    dims = (roster.window, roster.channels, roster.num_classes, roster.kind, *roster.target)
    slots = [ClientSlot(cid, trainers.get(cid), evaluated.get(cid), cid in roster.new_clients, dims,
                        roster.classes.get(cid, ())) for cid in order]
    return slots, roster


_SLOTS: dict[tuple[str, bool], list[ClientSlot]] = {}  # per process (a Ray actor serves many nodes)


def slots_for(cfg: RunConfig, with_pooled_test: bool) -> list[ClientSlot]:
    key = (cfg.hash(), with_pooled_test)
    if key not in _SLOTS:
        prepare_process(cfg.threads, cfg.precision, cfg.deterministic)
        _SLOTS.clear()
        _SLOTS[key] = build_slots(cfg, with_pooled_test)[0]
    return _SLOTS[key]


STATE = "fedwear.state"
TRAIN_ACTION = "fedwear"  # message type train.fedwear


def handle(slot: ClientSlot, msg, context):
    """Answer one Flower message for ``slot`` (query, train or evaluate)."""
    fa = _flwr()
    kind = msg.metadata.message_type.split(".")[0]
    if kind == "query":
        window, channels, classes, task_kind, shift, scale = slot.dims
        return fa.Message(fa.RecordDict({"info": fa.ConfigRecord(
            {"client_id": slot.client_id, "new": slot.new, "trains": slot.trainer is not None,
             "window": window, "channels": channels, "num_classes": classes, "kind": task_kind,
             "target_shift": shift, "target_scale": scale, "classes": list(slot.classes) or [-1],  # -1: none (Flower lists are not empty)
             "num_train": len(slot.trainer.data.train) if slot.trainer else 0,
             "sizes": list(split_sizes(slot.evaluator.data)) if slot.evaluator else [-1]})}), reply_to=msg)
    down, conf = from_content(msg.content)
    state = load_state(context)
    rnd = int(conf["round"])
    if kind == "train":
        return fa.Message(fa.RecordDict(to_content(train(slot, down, context, rnd))), reply_to=msg)
    if kind == "evaluate":
        glob = from_content(msg.content, prefix="global.")[0] if conf.get("has_global") else None
        rows, keep = slot.evaluator.evaluate(down, state, glob, rnd, new=slot.new) if slot.evaluator else ([], None)
        if keep is not None:
            store_state(context, keep)
        return fa.Message(fa.RecordDict(rows_to_content(rows)), reply_to=msg)
    raise ValueError(f"unknown message type {msg.metadata.message_type!r}")


def load_state(context) -> Record:
    """The client state kept in ``Context.state`` (empty before the first round)."""
    if f"{STATE}.arrays" not in context.state:
        return Record()
    return from_content(context.state, prefix=f"{STATE}.")[0]


def train(slot: ClientSlot, down: Record, context, round: int) -> Record:
    """Local training: the method's ``fit``, its new client state stored in ``Context.state``."""
    if slot.trainer is None:
        raise RuntimeError(f"client {slot.client_id} does not train")
    up, state = slot.trainer.fit(down, load_state(context), round)
    store_state(context, state)
    return up


def store_state(context, state: Record) -> None:
    """Keep ``state`` in ``Context.state`` for the next message."""
    for key, value in to_content(state, prefix=f"{STATE}.").items():
        context.state[key] = value


def make_client_app(slot_of):
    """A ClientApp whose node plays ``slot_of(context)``.

    fedwear's training is ``train.fedwear``; plain ``train`` is SecAgg+ traffic, answered
    through Flower's ``secaggplus_mod``.
    """
    from flwr.client.mod import secaggplus_mod
    from flwr.clientapp import ClientApp

    app = ClientApp()

    def _handler(msg, context):
        return handle(slot_of(context), msg, context)

    def _secagg(msg, context):
        return secagg_train(slot_of(context), msg, context, train)

    app.train(TRAIN_ACTION)(_handler)
    app.train(mods=[secaggplus_mod])(_secagg)
    app.evaluate()(_handler)
    app.query()(_handler)
    return app


def make_sim_client_app(cfg: RunConfig):
    """The simulation's ClientApp: the node with ``partition-id`` i plays roster client i."""
    return make_client_app(lambda context: slots_for(cfg, True)[int(context.node_config["partition-id"])])


# ---- server side ------------------------------------------------------------------------------
def roster_from_nodes(info: dict[str, dict]) -> Roster:
    """The roster of a deployment, from the nodes' answers to the query message."""
    if not info:
        raise FedwearError("no Flower node answered; start the SuperNodes (fedwear flower client ...)")
    dims = {(i["window"], i["channels"], i["num_classes"], i["kind"], i["target_shift"], i["target_scale"])
            for i in info.values()}
    if len(dims) > 1:
        raise FedwearError(f"the nodes disagree on window/channels/classes/task {sorted(dims)}: give them the same config")
    window, channels, classes, task_kind, shift, scale = dims.pop()
    ids = sorted(info)
    return Roster(
        clients=[c for c in ids if not info[c]["new"]],
        new_clients=[c for c in ids if info[c]["new"]],
        trainers=[c for c in ids if info[c]["trains"]],
        window=window, channels=channels, num_classes=classes, kind=task_kind, target=(shift, scale),
        classes={c: tuple(int(k) for k in info[c].get("classes", []) if k >= 0) for c in ids
                 if task_kind == "classification"},
        # what each training node reported at the query: the most its replies may weigh
        train_sizes={c: info[c]["num_train"] for c in ids
                     if info[c]["trains"] and isinstance(info[c].get("num_train"), int)},
        # and the windows of each split it evaluates on: what its evaluation rows must count
        split_sizes={c: tuple(info[c]["sizes"]) for c in ids if _sizes_ok(info[c].get("sizes"))},
    )


def _sizes_ok(sizes: object) -> bool:
    return (isinstance(sizes, list) and len(sizes) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in sizes))


class GridExecutor:
    """Executes a round's client work through a Flower ``Grid``; client state stays on the nodes."""

    def __init__(self, grid, cfg: RunConfig, expected: int) -> None:
        self.grid = grid
        self.cfg = cfg
        #: The method's ``reply_spec``: SecAgg+ names the mean it returns by it (unset: the down's names).
        self.reply_spec: Callable[[Record], dict] | None = None
        self.bytes_down = 0
        self.bytes_up = 0
        self.node_of: dict[str, int] = {}
        self.info: dict[str, dict] = {}
        self._connect(cfg.flower.min_nodes or expected)

    def _connect(self, wanted: int) -> None:
        fa = _flwr()
        deadline = time.monotonic() + self.cfg.flower.connect_timeout
        while len(list(self.grid.get_node_ids())) < wanted:
            if time.monotonic() > deadline:
                have = len(list(self.grid.get_node_ids()))
                raise FedwearError(f"only {have} of {wanted} Flower nodes connected within "
                                   f"{self.cfg.flower.connect_timeout:.0f} s (flower.connect_timeout)")
            time.sleep(0.1)
        nodes = sorted(self.grid.get_node_ids())
        msgs = [fa.Message(fa.RecordDict(), dst_node_id=n, message_type=fa.MessageType.QUERY, group_id="query")
                for n in nodes]
        for node, reply in self._send(msgs, "query").items():
            if reply.has_error():
                log.warning("node %s failed the query: %s", node, reply.error.reason)
                continue
            info = dict(reply.content["info"])
            self.node_of[info["client_id"]] = node
            self.info[info["client_id"]] = info
        log.info("Flower nodes: %s", {c: n for c, n in self.node_of.items()})

    def _send(self, msgs: list, what: str) -> dict[int, object]:
        """Send and wait (``flower.round_timeout``); replies by destination node."""
        sent = {}
        replies = list(self.grid.send_and_receive(msgs, timeout=self.cfg.flower.round_timeout))
        for m in msgs:
            sent[m.metadata.message_id] = m.metadata.dst_node_id
        out = {sent[r.metadata.reply_to_message_id]: r for r in replies if r.metadata.reply_to_message_id in sent}
        for node in set(sent.values()) - set(out):
            log.warning("%s: no reply from node %s within %ss", what, node, self.cfg.flower.round_timeout)
        return out

    def _messages(self, kind: str, contents: dict[str, dict], round: int) -> tuple[list, dict[int, str]]:
        fa = _flwr()
        msgs, client_of = [], {}
        for cid, content in contents.items():
            node = self.node_of.get(cid)
            if node is None:
                log.warning("round %d: client %s has no connected Flower node", round, cid)
                continue
            msgs.append(fa.Message(fa.RecordDict(content), dst_node_id=node, message_type=kind, group_id=str(round)))
            client_of[node] = cid
        return msgs, client_of

    def fit(self, round: int, downs: dict[str, Record], on_reply: Callable[[str], None] | None = None,
            on_step: Callable[[str, int, int], None] | None = None) -> dict[str, Record]:
        """``on_step`` is not called: the steps are taken in the ClientApps."""
        if self.cfg.flower.secagg.enabled:
            return self._secure_fit(round, downs)
        contents = {c: to_content(d, {"round": round}) for c, d in downs.items()}
        msgs, client_of = self._messages(f"train.{TRAIN_ACTION}", contents, round)
        self.bytes_down += sum(wire_bytes(m.content["arrays"]) for m in msgs)
        out = {}
        for node, reply in self._send(msgs, f"round {round}").items():
            cid = client_of[node]
            if reply.has_error():
                log.warning("round %d: client %s (node %s) failed: %s", round, cid, node, reply.error.reason)
                continue
            try:
                out[cid] = from_content(reply.content)[0]
            except (KeyError, ValueError, TypeError) as e:
                log.warning("round %d: client %s sent an unreadable reply: %s", round, cid, e)
                continue
            self.bytes_up += wire_bytes(reply.content["arrays"])
            if on_reply:
                on_reply(cid)
        return out

    def _secure_fit(self, round: int, downs: dict[str, Record]) -> dict[str, Record]:
        """SecAgg+: the server learns only the mean; each contributor is credited with it (weight 1)."""
        if not downs:
            return {}
        first = next(iter(downs.values()))
        if any(d.arrays.keys() != first.arrays.keys() or
               any(not np.array_equal(d.arrays[k], first.arrays[k]) for k in first.arrays) for d in downs.values()):
            raise FedwearError("flower.secagg needs the same message for every client (FedAvg-style methods)")
        nodes = {c: self.node_of[c] for c in downs if c in self.node_of}
        # under central DP every reply weighs 1 (privacy.py): a larger bound would only cost precision
        weight = self.cfg.flower.secagg.max_weight or (
            1 if self.cfg.privacy.dp == "central" else max(int(self.info[c]["num_train"]) for c in nodes))
        names = list(self.reply_spec(first) if self.reply_spec else first.arrays)
        mean, contributors = secure_mean(self.grid, self.cfg, nodes, first, round, weight, names)
        self.bytes_down += first.nbytes * len(nodes)
        self.bytes_up += first.nbytes * len(contributors)
        return {c: Record(mean, {"num_examples": 1}) for c in contributors}

    def evaluate(self, round: int, downs: dict[str, Record], global_msg: Record | None) -> dict[str, list[Row]]:
        fa = _flwr()
        extra = to_content(global_msg, prefix="global.") if global_msg is not None else {}
        contents = {c: {**to_content(d, {"round": round, "has_global": global_msg is not None}), **extra}
                    for c, d in downs.items()}
        msgs, client_of = self._messages(fa.MessageType.EVALUATE, contents, round)
        out = {}
        for node, reply in self._send(msgs, f"evaluation {round}").items():
            if reply.has_error():
                log.warning("evaluation %d: client %s failed: %s", round, client_of[node], reply.error.reason)
                continue
            out[client_of[node]] = rows_from_content(reply.content)
        return out

    def client_states(self) -> dict[str, Record]:
        return {}  # kept in each node's Context.state

    def checkpoint_saved(self) -> None:
        pass  # nothing of the clients' is kept here

    def restore(self, states: dict[str, Record]) -> None:
        if states:
            raise FedwearError("--resume is not supported on the Flower engines: client states live on the nodes")

    def close(self) -> None:
        pass


def make_server_app(cfg: RunConfig, method: Method, roster: Roster, callbacks: list[Callback],
                    restore: dict | None, result: dict):
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def _main(grid, context) -> None:
        expected = len(dict.fromkeys([*roster.trainers, *roster.clients, *roster.new_clients]))
        executor = GridExecutor(grid, cfg, expected)
        executor.reply_spec = method.reply_spec
        runner = Runner(cfg, method, roster, executor, callbacks)
        if restore is not None:
            runner.restore(restore)
        runner.run()
        result["bytes"] = (executor.bytes_down, executor.bytes_up)

    return app


def run_simulation(cfg: RunConfig, method: Method, roster: Roster, callbacks: list[Callback],
                   restore: dict | None) -> dict:
    """Run on Flower's simulation runtime (Ray): one virtual SuperNode per client of the roster, on
    a Ray instance of this machine's cores or on the cluster at ``flower.ray_address`` (whose
    workers keep the niceness the cluster was started with)."""
    _flwr()
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    # Ray starts its workers at nice 15, so on a busy machine the actors that do all of the
    # clients' work starve behind any other process (benchmarks/flower_sim_under_load.py at commit e6cb47ba6e).
    os.environ.setdefault("RAY_worker_niceness", "0")
    from flwr.simulation import run_simulation as flwr_run_simulation

    if restore is not None:
        raise FedwearError("--resume is not supported on engine=flower-sim; rerun without --resume")
    result: dict = {}
    n = len(dict.fromkeys([*roster.trainers, *roster.clients, *roster.new_clients]))
    cpus = os.cpu_count() or 1
    logging.getLogger("flwr").setLevel(logging.ERROR)  # its run_simulation deprecation notice
    flwr_run_simulation(
        server_app=make_server_app(cfg, method, roster, callbacks, restore, result),
        client_app=make_sim_client_app(cfg),
        num_supernodes=n,
        backend_config={
            "client_resources": {"num_cpus": cfg.flower.cpus_per_client, "num_gpus": 0.0},
            "init_args": {"logging_level": "ERROR", "log_to_driver": False,
                          **({"address": cfg.flower.ray_address} if cfg.flower.ray_address else {"num_cpus": cpus})},
        },
    )
    if "bytes" not in result:
        raise FedwearError("the Flower simulation ended before the run finished; see run.log")
    return result
