"""Robust aggregation (config ``robust``): the round loop's replacement for a plain mean, for
methods whose server averages client arrays (``Method.mean_aggregation``).

- ``norm_bound``: each reply's update (its float arrays minus the global model's, as one vector)
  is scaled down to L2 norm <= the bound before the method aggregates (norm bounding, Sun et al.
  2019, "Can You Really Backdoor Federated Learning?"). A poisoned reply can then move the mean
  by at most ``bound * weight / total weight``. Composes with central DP (the noise is added to
  the mean of the bounded replies).
- ``rule: median`` / ``trimmed_mean``: every averaged coordinate is the median (Yin et al. 2018)
  or the ``trim``-trimmed mean of the replies, unweighted, as Flower's FedMedian and
  FedTrimmedAvg compute them (numpy's median, scipy's ``trim_mean``). With 2f + 1 replies, f
  poisoned ones cannot move a coordinate outside the honest replies' range.

Arrays the method does not average (those missing from the server state or from any reply, and
integer arrays) are the method's own aggregate.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import stats

from fedwear.config import RobustConfig
from fedwear.methods.api import Record


def averaged_keys(server: Record, replies: dict[str, Record]) -> list[str]:
    """The server's float arrays that every reply carries: the ones a mean aggregation averages."""
    return [k for k, a in server.arrays.items()
            if a.dtype.kind == "f" and all(k in r.arrays for r in replies.values())]


def bounded(server: Record, replies: dict[str, Record], bound: float) -> dict[str, Record]:
    """``replies`` with each update ``reply - server`` scaled down to L2 norm <= ``bound``."""
    keys = averaged_keys(server, replies)
    out = {}
    for client, reply in replies.items():
        updates = {k: reply.arrays[k].astype(np.float64) - server.arrays[k] for k in keys}
        norm = float(np.sqrt(sum(np.sum(u * u) for u in updates.values())))
        if norm <= bound:
            out[client] = reply
            continue
        scale = bound / norm
        arrays = {k: (server.arrays[k] + scale * u).astype(reply.arrays[k].dtype) for k, u in updates.items()}
        out[client] = Record({**reply.arrays, **arrays}, reply.scalars)
    return out


def robust_aggregate(aggregate: Callable[[dict[str, Record]], Record], server: Record, replies: dict[str, Record],
                     settings: RobustConfig) -> Record:
    """The method's ``aggregate`` of ``replies``, with their updates bounded and, for ``median`` or
    ``trimmed_mean``, each averaged array replaced by that statistic of the replies."""
    if settings.norm_bound is not None and replies:
        replies = bounded(server, replies, settings.norm_bound)
    out = aggregate(replies)
    if settings.rule == "mean" or not replies:
        return out
    robust = {}
    for k in averaged_keys(server, replies):
        stack = np.stack([r.arrays[k].astype(np.float64) for r in replies.values()])
        value = np.median(stack, axis=0) if settings.rule == "median" else stats.trim_mean(stack, settings.trim, axis=0)
        robust[k] = np.asarray(value, dtype=server.arrays[k].dtype)
    return Record({**out.arrays, **robust}, out.scalars)
