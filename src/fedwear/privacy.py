"""Differential privacy as a wrapper around a method, never inside a method file.

Central DP with client-side fixed clipping, the DP-FedAvg recipe (McMahan et al., ICLR 2018,
Alg. 1 with flat clipping; Flower's ``DifferentialPrivacyClientSideFixedClipping``): each
client clips its update ``up - down`` to L2 norm <= C (Flower's
``compute_clip_model_update``) and replies with weight 1; the server averages the m replies
with equal weights and adds Gaussian noise of std ``z C / m`` to the mean (Flower's
``compute_stdv`` and ``add_gaussian_noise_inplace``). The noise is drawn from
``derive_seed(seed, "dp", round)`` so runs stay reproducible. Only methods whose
aggregation is a mean of the replied arrays qualify (``Method.mean_aggregation``).
"""

from __future__ import annotations

import numpy as np

from fedwear.errors import ConfigError, FedwearError
from fedwear.methods.api import Method, Plan, Record
from fedwear.seeding import derive_seed


def _dp():
    try:
        from flwr.supercore import differential_privacy
    except ImportError:
        raise FedwearError("privacy.dp needs Flower's DP functions: pip install 'fedwear[flower]'") from None
    return differential_privacy


class CentralDP:
    """Wraps ``method``: clipped client updates, noisy equal-weight mean on the server
    (``settings``: the config's ``privacy`` block)."""

    def __init__(self, method: Method, settings) -> None:
        if not getattr(method, "mean_aggregation", False):
            raise ConfigError(
                f"privacy.dp=central: {method.name} does not aggregate by a mean of client arrays; "
                "central DP needs a method whose server averages client arrays (Method.mean_aggregation)"
            )
        _dp()
        self.inner = method
        self.settings = settings

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def training_bytes(self) -> int:  # measured by the inner method's training
        return self.inner.training_bytes

    @training_bytes.setter
    def training_bytes(self, value: int) -> None:
        self.inner.training_bytes = value

    def fit(self, down: Record, state: Record, data, round: int, seed: int) -> tuple[Record, Record]:
        up, new_state = self.inner.fit(down, state, data, round, seed)
        return self._clip(down, up), new_state

    def fit_many(self, jobs: list, round: int) -> list[tuple[Record, Record]]:
        results = self.inner.fit_many(jobs, round)
        return [(self._clip(job[0], up), state) for job, (up, state) in zip(jobs, results, strict=True)]

    def _clip(self, down: Record, up: Record) -> Record:
        keys = [k for k in up.arrays if k in down.arrays and up.arrays[k].dtype.kind == "f"]
        clipped = [up.arrays[k].astype(np.float64) for k in keys]
        _dp().compute_clip_model_update(clipped, [down.arrays[k].astype(np.float64) for k in keys],
                                        self.settings.clipping_norm)
        arrays = {**up.arrays, **{k: c.astype(up.arrays[k].dtype) for k, c in zip(keys, clipped, strict=True)}}
        return Record(arrays, {**up.scalars, "num_examples": 1})

    def aggregate(self, server: Record, replies: dict[str, Record], round: int, plan: Plan | None = None) -> Record:
        out = self.inner.aggregate(server, replies, round, plan)
        if not replies:
            return out
        dp = _dp()
        std = dp.compute_stdv(self.settings.noise_multiplier, self.settings.clipping_norm, len(replies))
        keys = [k for k in next(iter(replies.values())).arrays if out.arrays[k].dtype.kind == "f"]
        noisy = [out.arrays[k].copy() for k in keys]
        saved = np.random.get_state()
        try:  # Flower draws from numpy's global generator: seed it per round
            np.random.seed(derive_seed(self.inner.task.training.seed, "dp", round) % 2**32)
            dp.add_gaussian_noise_inplace(noisy, std)
        finally:
            np.random.set_state(saved)
        return Record({**out.arrays, **dict(zip(keys, noisy, strict=True))}, out.scalars)

    @staticmethod
    def describe(cfg) -> dict:
        """The privacy parameters recorded in summary.json."""
        p = cfg.privacy
        return {"dp": "central", "clipping_norm": p.clipping_norm, "noise_multiplier": p.noise_multiplier,
                "rounds": cfg.rounds, "clients_per_round": cfg.clients_per_round,
                "mechanism": "client-side fixed clipping + Gaussian noise std z*C/m on the equal-weight mean",
                "epsilon": None, "epsilon_note": "no accountant installed; compute epsilon from z, sampling rate and rounds (e.g. RDP)"}


def private(method: Method, settings) -> Method:
    """``method`` wrapped for the config's ``privacy`` block ``settings`` (unchanged when its dp
    is none)."""
    if settings.dp == "central":
        return CentralDP(method, settings)  # type: ignore[return-value]
    return method
