"""Secure aggregation with Flower's SecAgg+ (Bell et al., CCS 2020) for mean-aggregating methods.

The server never sees a single client's update, only ``sum_i w_i d_i / sum_i w_i`` over the
clients that finished, where ``d_i = up_i - down`` for a reply array the down message also holds
and the array itself otherwise (central DP by parts: the clipped parts, ``privacy.py``). Updates
are small, so they survive SecAgg+'s clipping to ``[-clipping_range, clipping_range]`` and
quantisation. Under central DP every weight is 1, the server adds the noise to what SecAgg+
returns, and each client's clipping bounds its share (the recipe of Flower's
``DifferentialPrivacyClientSideFixedClipping``, which composes with SecAgg+). Flower 1.41 offers SecAgg+
only through its legacy workflow: ``SecAggPlusWorkflow`` on a ``LegacyContext`` on the server,
``secaggplus_mod`` on the client, with arrays passed by position in the legacy ``FitIns`` /
``FitRes`` layout. This module adapts fedwear's records to that layout and back.
"""

from __future__ import annotations

import logging

import numpy as np

from fedwear.config import RunConfig
from fedwear.methods.api import Record

log = logging.getLogger("fedwear")
NAMES = "fedwear.names"
REPLY = "fedwear.reply"


def secure_mean(grid, cfg: RunConfig, nodes: dict[str, int], down: Record, round: int, max_weight: float,
                reply: list[str]) -> tuple[dict[str, np.ndarray], list[str]]:
    """One SecAgg+ round over ``nodes`` (client -> node id): the mean reply, with the arrays
    named ``reply`` (the method's ``reply_spec``), and who contributed.

    ``max_weight`` should be the largest client weight: SecAgg+ quantises ``w_i / max_weight``
    and the update scaled by it, so a loose bound costs precision.
    """
    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import ConfigRecord, Context, RecordDict
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.client_manager import SimpleClientManager
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.strategy import FedAvg as LegacyFedAvg
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey

    names = list(down.arrays)
    contributed: list[int] = []

    class Recorder(LegacyFedAvg):
        def aggregate_fit(self, server_round, results, failures):
            contributed.extend(proxy.node_id for proxy, _ in results)
            return super().aggregate_fit(server_round, results, failures)

    config = {"round": round, NAMES: "\n".join(names), REPLY: "\n".join(reply),
              **{f"s.{k}": v for k, v in down.scalars.items()}}
    manager = SimpleClientManager()
    for node in nodes.values():
        manager.register(GridClientProxy(node_id=node, grid=grid, run_id=grid.run.run_id))
    n = len(nodes)
    strategy = Recorder(fraction_fit=1.0, min_fit_clients=n, min_available_clients=n,
                        on_fit_config_fn=lambda _: dict(config))
    context = LegacyContext(Context(run_id=grid.run.run_id, node_id=0, node_config={}, state=RecordDict(),
                                    run_config={}),
                            config=ServerConfig(num_rounds=1), strategy=strategy, client_manager=manager)
    context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        ndarrays_to_parameters([down.arrays[k] for k in names]), keep_input=True)
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: round})
    s = cfg.flower.secagg
    SecAggPlusWorkflow(num_shares=s.num_shares, reconstruction_threshold=s.reconstruction_threshold,
                       max_weight=float(max_weight), clipping_range=s.clipping_range,
                       timeout=cfg.flower.round_timeout)(grid, context)
    if not contributed:
        log.warning("round %d: secure aggregation halted (too few clients finished)", round)
        return {}, []
    mean = parameters_to_ndarrays(compat.arrayrecord_to_parameters(
        context.state.array_records[MAIN_PARAMS_RECORD], keep_input=True))
    arrays = {k: (down.arrays[k] + d).astype(down.arrays[k].dtype) if k in down.arrays else d
              for k, d in zip(reply, mean, strict=True)}
    client_of = {v: k for k, v in nodes.items()}
    return arrays, [client_of[n] for n in contributed]


def secagg_train(slot, msg, context, train):
    """Client side, called by ``secaggplus_mod`` with the legacy FitIns layout; ``train`` is the
    engine's ``train(slot, down, context, round) -> Record``."""
    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import Message
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    names = str(fitins.config[NAMES]).split("\n")
    arrays = dict(zip(names, parameters_to_ndarrays(fitins.parameters), strict=True))
    scalars = {k[2:]: v for k, v in fitins.config.items() if k.startswith("s.")}
    down = Record(arrays, scalars)
    up = train(slot, down, context, int(fitins.config["round"]))
    deltas = [up.arrays[k].astype(np.float64) - down.arrays[k].astype(np.float64) if k in down.arrays
              else up.arrays[k].astype(np.float64) for k in str(fitins.config[REPLY]).split("\n")]
    res = FitRes(status=Status(Code.OK, ""), parameters=ndarrays_to_parameters(deltas),
                 num_examples=int(up.scalars["num_examples"]), metrics={})
    return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=msg)
