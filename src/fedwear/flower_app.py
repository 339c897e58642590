"""Flower apps for a real deployment (SuperLink + SuperNodes), referenced by ``flwr run``.

Server (``run_config``): ``config`` (path of the run config on the server), ``out`` (run
directory), ``nodes`` (SuperNodes to wait for). Each SuperNode (``node_config``): ``config``
(path of the run config on that node; its ``dataset.root`` holds only this node's data),
optionally ``data-root`` (overrides ``dataset.root``), ``client`` (which client of that data
this node plays; needed only when the root holds several) and ``role`` (``train`` or ``new``).
"""

from __future__ import annotations

import logging
from functools import cache

from flwr.serverapp import ServerApp

from fedwear.engines.flower import ClientSlot, build_slots, make_client_app
from fedwear.engines.process import prepare_process
from fedwear.errors import FedwearError

server_app = ServerApp()
STREAM_FORMAT = "%(levelname)s: %(message)s"


@server_app.main()
def _serve(grid, context) -> None:
    from fedwear.api import serve  # only the server needs it; client processes start lighter

    rc = context.run_config
    stream_log()
    serve(str(rc["config"]), str(rc["out"]), grid, nodes=int(rc.get("nodes", 1)) or None,
          overwrite=bool(rc.get("overwrite", False)))


def stream_log() -> None:
    """fedwear's log from INFO up on stderr, attached once.

    The ServerApp process mirrors its stdout and stderr to the SuperLink, and ``flwr run
    --stream`` shows them (https://flower.ai/docs/framework/ref-api-cli.html#flwr-run), so the
    per-round lines reach ``fedwear flower serve``.
    """
    log = logging.getLogger("fedwear")
    log.setLevel(logging.INFO)
    if not any(getattr(h, "_fedwear_stream", False) for h in log.handlers):
        h = logging.StreamHandler()
        h.setLevel(logging.INFO)
        h.setFormatter(logging.Formatter(STREAM_FORMAT))
        h._fedwear_stream = True  # type: ignore[attr-defined]
        log.addHandler(h)


@cache
def node_slot(config: str, data_root: str, client: str, role: str) -> ClientSlot:
    """This node's client, built from the data on this node only."""
    from fedwear.config import load_config

    sets = [f"dataset.root={data_root}"] if data_root else []
    cfg = load_config(config, [*sets, "dataset.held_out=0", "engine=flower"])  # a deployment's node
    prepare_process(cfg.threads, cfg.precision, cfg.deterministic)
    slots, _ = build_slots(cfg, with_pooled_test=False)
    if client:
        chosen = [s for s in slots if s.client_id == client]
        if not chosen:
            raise FedwearError(f"node-config client={client!r} is not in {cfg.dataset.root} "
                               f"(clients there: {[s.client_id for s in slots]})")
    elif len(slots) != 1:
        raise FedwearError(f"{cfg.dataset.root} holds {len(slots)} clients; give this node only its own "
                           "data or set node-config client=<id>")
    else:
        chosen = slots
    slot = chosen[0]
    if role == "new":
        slot.new, slot.trainer = True, None
    return slot


def _slot_of(context) -> ClientSlot:
    nc = context.node_config
    return node_slot(str(nc["config"]), str(nc.get("data-root", "")), str(nc.get("client", "")),
                     str(nc.get("role", "train")))


client_app = make_client_app(_slot_of)
