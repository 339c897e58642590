"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020, Algorithm 1, option II).

Server state: the model x and the server control variate c (arrays ``c.<parameter>``, zeros at
start); both go down. A client keeps its own control variate c_i (``ci.<parameter>``, zeros
until it first trains) and corrects every local gradient by ``c - c_i`` (Alg. 1 line 10); after
K local steps with learning rate eta_l it sets (line 12, option II)

    c_i+ = c_i - c + (x - y_i) / (K eta_l)

and replies with ``Delta y_i = y_i - x`` under the model's names and ``Delta c_i = c_i+ - c_i``
under ``c.``, i.e. the names and shapes of the message it received (line 13). The server
(lines 16-17) takes uniform means over the round's replies S:

    x <- x + eta_g mean(Delta y_i),    c <- c + |S| / N mean(Delta c_i)    (N: training clients)

With a learning-rate scheduler K eta_l is the sum of the step sizes actually taken. With SGD
momentum beta (ProtoHAR's protocol: 0.9, kept across rounds) a step moves the weights by
eta / (1 - beta) times the gradient once the momentum has built up, so each step counts as
eta / (1 - beta): dividing by K eta alone overestimates c_i by up to 1 / (1 - beta) (10x), and
the corrected gradients then grow round after round until the model diverges.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from fedwear.methods.api import Options, Plan, Record
from fedwear.methods.fedavg import FedAvg
from fedwear.methods.training import model_arrays

C, CI = "c.", "ci."


class ScaffoldOptions(Options):
    server_lr: float = Field(
        1.0, gt=0, description="global step size eta_g (Karimireddy et al. 2020, Alg. 1 line 17); "
        "1.0 as in the paper's experiments",
    )


class Scaffold(FedAvg):
    name = "scaffold"
    summary = "SCAFFOLD (Karimireddy et al. 2020): control variates correct the clients' drift."
    Options = ScaffoldOptions
    mean_aggregation = False  # replies are deltas and the means are uniform: no DP / secagg wrapper
    no_dp_reason = "its control variates are a second mean that the clipping of DP-FedAvg does not bound"

    def init_server(self) -> Record:
        """The server input (Alg. 1 line 1): x, the shared parts, and c = 0 for their parameters."""
        x = super().init_server().arrays
        params = [n for n, _ in self.model.named_parameters() if n in x]
        return Record({**x, **{C + n: np.zeros_like(x[n]) for n in params}})

    def global_message(self, server: Record) -> Record | None:
        """The model x alone (the control variate is not part of it)."""
        return Record({k: v for k, v in server.arrays.items() if not k.startswith(C)})

    def evaluation_message(self, server: Record, client: str, round: int) -> Record:
        """Evaluation needs the model x, not c."""
        return self.global_message(server)

    def aggregate(self, server: Record, replies: dict[str, Record], round: int, plan: Plan | None = None) -> Record:
        """x += eta_g mean(Delta y_i), c += |S|/N mean(Delta c_i) (Alg. 1 lines 16-17)."""
        if not replies:
            return server
        new, eta_g = {}, self.options.server_lr
        for k, v in server.arrays.items():
            step = len(replies) / self.task.num_clients if k.startswith(C) else eta_g
            mean = np.mean([r.arrays[k].astype(np.float64) for r in replies.values()], axis=0)
            new[k] = np.asarray(v + step * mean, dtype=v.dtype)
        return Record(new, dict(server.scalars))

    def prepare(self, fit):
        """x, c and c_i (zeros on a client's first round); the correction c - c_i of every local
        gradient (Alg. 1 line 10)."""
        super().prepare(fit)
        names = [n for n, _ in fit.model.named_parameters() if C + n in fit.down.arrays]
        c = {n: fit.down.arrays[C + n] for n in names}
        ci = {n: fit.state.arrays.get(CI + n, np.zeros_like(a)) for n, a in c.items()}
        fit.correction = {n: self.on_device(c[n] - ci[n]) for n in names}
        fit.notes.update(c=c, ci=ci, start=model_arrays(fit.model, self.shared))

    def reply(self, fit):
        """Delta y_i and Delta c_i (Alg. 1 lines 12-13), c_i+ by option II; K eta_l is
        ``fit.step_sizes`` (heavy ball: eta / (1 - beta) a step, module docstring)."""
        x, y = fit.notes["start"], model_arrays(fit.model, self.shared)
        c, ci, steps = fit.notes["c"], fit.notes["ci"], fit.step_sizes
        fit.notes["ci_new"] = ci_new = {  # option II (line 12); no step taken (no data): c_i is kept
            n: (ci[n] - c[n] + (x[n] - y[n]) / steps).astype(ci[n].dtype) if steps else ci[n] for n in c
        }
        up = {**{k: y[k] - x[k] for k in x}, **{C + n: ci_new[n] - ci[n] for n in c}}
        return Record(up, {"num_examples": len(fit.data.train), "loss": fit.loss})

    def client_state(self, fit):
        """FedAvg's, plus c_i+."""
        kept = super().client_state(fit)
        kept.arrays.update({CI + n: v for n, v in fit.notes["ci_new"].items()})
        return kept


__all__ = ["Scaffold"]
