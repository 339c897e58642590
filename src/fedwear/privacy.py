"""Differential privacy as a wrapper around a method, never inside a method file.

Central DP with client-side fixed clipping, the DP-FedAvg recipe (McMahan et al., ICLR 2018,
Alg. 1 with flat clipping; Flower's ``DifferentialPrivacyClientSideFixedClipping``): each
client clips its update ``up - down`` to L2 norm <= C (Flower's
``compute_clip_model_update``) and replies with weight 1; the server averages the m replies
with equal weights and adds Gaussian noise of std ``z C / m`` to the mean (Flower's
``compute_stdv`` and ``add_gaussian_noise_inplace``). The noise is drawn from
``derive_seed(seed, "dp", round)`` so runs stay reproducible. Methods whose server state is
a mean of the replied arrays qualify (``Method.mean_aggregation``), and those whose server
steps towards that mean (``Method.mean_step``: Reptile's ``theta + s (mean - theta)`` with
s <= 1; Meta-HAR, FedMAT), which get the noise on the mean before their step; the others
say why not (``Method.no_dp_reason``).

Accounting (:func:`epsilon`) is Google's ``dp-accounting`` RDP accountant for exactly what a
round does: m of the N training clients drawn uniformly without replacement
(:func:`fedwear.seeding.client_schedule`), then the Gaussian mechanism on the sum of their
clipped updates, composed over the rounds. Fixed-size sampling is analysed under replace-one
neighbouring datasets (Wang, Balle and Kasiviswanathan, AISTATS 2019), where swapping one
client's update for another's moves the sum by up to 2C: noise of std z C is z / 2 times that
sensitivity, and that is the multiplier the accountant gets. The guarantee is per client (a
client's whole data), for what the server releases; it assumes the round's selection is not
published (the run folder's seed would reveal it).
"""

from __future__ import annotations

import functools
import logging
import math

import numpy as np

from fedwear.errors import ConfigError, FedwearError
from fedwear.methods.api import Method, Plan, Record
from fedwear.seeding import derive_seed

#: The largest noise multiplier :func:`noise_for_budget` considers: above it, noise of std
#: z C / m drowns any update a run of m clients can average.
MAX_NOISE_MULTIPLIER = 1e4
ACCOUNTANT = "RDP (dp_accounting.rdp.RdpAccountant), replace-one neighbours, m of N clients sampled without replacement"


def _dp():
    try:
        from flwr.supercore import differential_privacy
    except ImportError:
        raise FedwearError("privacy.dp needs Flower's DP functions: pip install 'fedwear[flower]'") from None
    return differential_privacy


def _accounting():
    try:
        import dp_accounting
        from dp_accounting import rdp
    except ImportError:
        raise FedwearError("privacy.dp accounting needs Google's dp-accounting: pip install 'fedwear[flower]'") from None
    return dp_accounting, rdp


def _round_event(noise_multiplier: float, clients: int, per_round: int, parts: int):
    """One round as a ``dp_accounting`` event: ``per_round`` of ``clients`` sampled without
    replacement, then ``parts`` Gaussian sums (each of its own clipped part, noise z times its
    bound), each at z / 2 replace-one sensitivities."""
    dpa, _ = _accounting()
    gaussian = dpa.GaussianDpEvent(noise_multiplier / 2)
    inner = gaussian if parts == 1 else dpa.ComposedDpEvent([gaussian] * parts)
    return dpa.SampledWithoutReplacementDpEvent(clients, per_round, inner)


def _accountant():
    dpa, rdp = _accounting()
    return rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)


def epsilon(noise_multiplier: float, clients: int, per_round: int, rounds: int, delta: float, parts: int = 1) -> float:
    """The epsilon at ``delta`` of ``rounds`` rounds, each of ``per_round`` of ``clients``
    clients sampled without replacement and noise multiplier z (inf for z = 0)."""
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    accountant = _accountant()
    accountant.compose(_round_event(noise_multiplier, clients, per_round, parts), rounds)
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=64)
def noise_for_budget(target_epsilon: float, clients: int, per_round: int, rounds: int, delta: float,
                     parts: int = 1) -> float:
    """The smallest noise multiplier (to the accountant's tolerance, rounded up) whose run
    stays within ``(target_epsilon, delta)``; a ConfigError when even
    :data:`MAX_NOISE_MULTIPLIER` does not."""
    if epsilon(MAX_NOISE_MULTIPLIER, clients, per_round, rounds, delta, parts) > target_epsilon:
        raise ConfigError(
            f"privacy.target_epsilon={target_epsilon:g} at delta={delta:g} needs a noise multiplier above "
            f"{MAX_NOISE_MULTIPLIER:g} for {rounds} rounds of {per_round} of {clients} clients: raise the budget, "
            "or train fewer rounds")
    dpa, _ = _accounting()
    from dp_accounting.mechanism_calibration import ExplicitBracketInterval

    tolerance = 1e-6  # brentq's root lies within it of the exact one: adding it keeps epsilon within the budget
    root = dpa.calibrate_dp_mechanism(
        _accountant, lambda z: dpa.SelfComposedDpEvent(_round_event(z, clients, per_round, parts), rounds),
        target_epsilon, delta, ExplicitBracketInterval(1e-3, MAX_NOISE_MULTIPLIER), tol=tolerance)
    return float(root) + tolerance


def noise_multiplier(cfg, clients: int, parts: int = 1) -> float:
    """The run's z: the one ``privacy.target_epsilon`` asks for, else ``privacy.noise_multiplier``."""
    p = cfg.privacy
    if p.target_epsilon is None:
        return p.noise_multiplier
    return noise_for_budget(p.target_epsilon, clients, cfg.clients_per_round_count(clients), cfg.rounds, p.delta,
                            parts)


class CentralDP:
    """Wraps ``method``: clipped client updates, noisy equal-weight mean on the server, for the
    run's config ``cfg`` (its ``privacy`` block, rounds and clients per round)."""

    def __init__(self, method: Method, cfg) -> None:
        if not method.private():
            raise ConfigError(f"privacy.dp=central: method={method.name} cannot run with it: {method.no_dp_reason}")
        _dp()
        self.inner = method
        self.settings = cfg.privacy
        #: central DP by parts (prototypes): each part's L2 bound; empty: one clipped update
        self.bounds = method.dp_bounds(cfg.privacy) if method.dp_part_count else {}
        self.noise_multiplier = noise_multiplier(cfg, method.task.num_clients, max(1, len(self.bounds)))

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

    def reply_spec(self, down: Record) -> dict[str, tuple[int, ...] | None]:
        if not self.bounds:
            return self.inner.reply_spec(down)
        zeros = Record({k: np.zeros(shape or (1,)) for k, shape in self.inner.reply_spec(down).items()})
        return {f"{part}/{k}": a.shape for part, arrays in self.inner.dp_parts(down, zeros).items()
                for k, a in arrays.items()}

    def validate_reply(self, down: Record, reply: Record) -> str | None:
        if not self.bounds:
            return self.inner.validate_reply(down, reply)
        return Method.validate_reply(self, down, reply)  # against the parts' names and shapes

    def _clip(self, down: Record, up: Record) -> Record:
        if self.bounds:
            return self._clip_parts(down, up)
        keys = [k for k in up.arrays if k in down.arrays and up.arrays[k].dtype.kind == "f"]
        clipped = [up.arrays[k].astype(np.float64) for k in keys]
        _dp().compute_clip_model_update(clipped, [down.arrays[k].astype(np.float64) for k in keys],
                                        self.settings.clipping_norm)
        arrays = {**up.arrays, **{k: c.astype(up.arrays[k].dtype) for k, c in zip(keys, clipped, strict=True)}}
        return Record(arrays, {**up.scalars, "num_examples": 1})

    def _clip_parts(self, down: Record, up: Record) -> Record:
        """The reply as the method's parts, each clipped to its bound (Flower's
        ``compute_clip_model_update`` is the same scaling, for an update)."""
        arrays = {}
        for part, values in self.inner.dp_parts(down, up).items():
            norm = np.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in values.values()))
            scale = min(1.0, self.bounds[part] / norm) if norm > 0 else 1.0
            arrays.update({f"{part}/{k}": (a * scale).astype(np.float32) for k, a in values.items()})
        return Record(arrays, {**up.scalars, "num_examples": 1})

    def _aggregate_parts(self, server: Record, replies: dict[str, Record], round: int) -> Record:
        """Each part summed over the replies, with noise of std z times its bound, given to the
        method's ``dp_aggregate``."""
        keys = list(next(iter(replies.values())).arrays)
        total = [np.sum([r.arrays[k].astype(np.float64) for r in replies.values()], axis=0) for k in keys]
        sums: dict[str, dict[str, np.ndarray]] = {}
        for part, bound in self.bounds.items():
            mine = [i for i, k in enumerate(keys) if k.startswith(part + "/")]
            noisy = self._noisy([total[i] for i in mine], 1, round, bound, salt=part)
            sums[part] = {keys[i].removeprefix(part + "/"): a for i, a in zip(mine, noisy, strict=True)}
        return self.inner.dp_aggregate(server, sums, len(replies))

    def aggregate(self, server: Record, replies: dict[str, Record], round: int, plan: Plan | None = None) -> Record:
        """The inner method's aggregate with noise on the mean of the clipped replies: on its
        result (mean aggregation: the server state is that mean), or on the mean it then steps
        towards (``mean_step``: Reptile's step, given the noisy mean as its one reply)."""
        if not replies:
            return self.inner.aggregate(server, replies, round, plan)
        if self.bounds:
            return self._aggregate_parts(server, replies, round)
        first = next(iter(replies.values()))
        if self.inner.mean_step:
            keys = [k for k in first.arrays if k in server.arrays and first.arrays[k].dtype.kind == "f"]
            means = [np.mean([r.arrays[k].astype(np.float64) for r in replies.values()], axis=0) for k in keys]
            noisy = self._noisy(means, len(replies), round)
            mean = Record({k: a.astype(first.arrays[k].dtype) for k, a in zip(keys, noisy, strict=True)},
                          {"num_examples": 1})
            return self.inner.aggregate(server, {"noisy mean": mean}, round, plan)
        out = self.inner.aggregate(server, replies, round, plan)
        keys = [k for k in first.arrays if out.arrays[k].dtype.kind == "f"]
        noisy = self._noisy([out.arrays[k].copy() for k in keys], len(replies), round)
        return Record({**out.arrays, **dict(zip(keys, noisy, strict=True))}, out.scalars)

    def _noisy(self, arrays: list[np.ndarray], m: int, round: int, bound: float | None = None,
               salt: str = "") -> list[np.ndarray]:
        """``arrays``, the mean of ``m`` replies clipped to ``bound`` (default: clipping_norm),
        with Gaussian noise of std z bound / m drawn from the round's seed (and ``salt``'s)."""
        dp = _dp()
        std = dp.compute_stdv(self.noise_multiplier, bound or self.settings.clipping_norm, m)
        saved = np.random.get_state()
        try:  # Flower draws from numpy's global generator: seed it per round
            np.random.seed(derive_seed(self.inner.task.training.seed, "dp", round, salt) % 2**32)
            dp.add_gaussian_noise_inplace(arrays, std)
        finally:
            np.random.set_state(saved)
        return arrays

    @staticmethod
    def describe(cfg, clients: int, rounds: int) -> dict:
        """The privacy of a run of ``cfg`` over ``clients`` training clients after ``rounds``
        rounds, as summary.json records it."""
        from fedwear.methods import method_class

        parts = max(1, method_class(cfg.method).dp_part_count)
        p, z = cfg.privacy, noise_multiplier(cfg, clients, parts)
        per_round = cfg.clients_per_round_count(clients)
        return {"dp": "central", "clipping_norm": p.clipping_norm, "noise_multiplier": z, "parts": parts,
                "target_epsilon": p.target_epsilon, "epsilon": epsilon(z, clients, per_round, rounds, p.delta, parts),
                "delta": p.delta, "rounds": rounds, "clients": clients, "clients_per_round": per_round,
                **({"prototype_clipping_norm": p.prototype_clipping_norm} if parts > 1 else {}),
                "mechanism": "client-side fixed clipping + Gaussian noise std z*C/m on the equal-weight mean" if parts == 1
                else f"{parts} parts (update, prototypes, classes held), each clipped to its bound B on the client; "
                     "Gaussian noise std z*B on each part's sum",
                "accountant": ACCOUNTANT}


def log_privacy(cfg, clients: int) -> None:
    """run.log's line on the privacy the whole run will give."""
    d = CentralDP.describe(cfg, clients, cfg.rounds)
    logging.getLogger("fedwear").info(
        "privacy: central DP, clipping norm %g, noise multiplier %.4g%s: (%.3g, %g)-DP per client after %d rounds "
        "of %d of %d clients (%s)", d["clipping_norm"], d["noise_multiplier"],
        f" (chosen for target_epsilon {d['target_epsilon']:g})" if d["target_epsilon"] else "", d["epsilon"],
        d["delta"], d["rounds"], d["clients_per_round"], d["clients"], ACCOUNTANT)


def private(method: Method, cfg) -> Method:
    """``method`` wrapped for the config's ``privacy`` block (unchanged when its dp is none)."""
    if cfg.privacy.dp == "central":
        return CentralDP(method, cfg)  # type: ignore[return-value]
    return method


def privacy_section(summaries: dict[str, list[dict]]) -> str | None:
    """Markdown: the (epsilon, delta) of each method's private runs (``summaries``: method -> its
    runs' summary.json), or None when no run used DP."""
    rows = []
    for method, runs in summaries.items():
        for s in runs:
            p = s.get("privacy") or {}
            if p.get("dp") == "central":
                rows.append(f"| {method} | {s.get('seed', '')} | {p['epsilon']:.3g} | {p['delta']:g} | "
                            f"{p['noise_multiplier']:.4g} | {p['clipping_norm']:g} | {p['rounds']} | "
                            f"{p['clients_per_round']} of {p['clients']} |")
    if not rows:
        return None
    return ("## Privacy\n\nCentral DP per client (docs/privacy.md): epsilon from dp-accounting's RDP accountant "
            "over the rounds run, m of N clients sampled without replacement each round.\n\n"
            "| method | seed | epsilon | delta | noise multiplier | clipping norm | rounds | clients per round |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows))
