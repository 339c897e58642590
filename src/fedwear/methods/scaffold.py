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
from torch import nn

from fedwear.methods.api import Options, Plan, Record
from fedwear.methods.fedavg import PARTS, FedAvg
from fedwear.methods.training import host, load_arrays, model_arrays

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

    def begin_fit(self, model: nn.Module, down: Record, state: Record) -> None:
        """Keep c and c_i (zeros on a client's first round) for the corrections."""
        self.params = {n: p for n, p in model.named_parameters() if C + n in down.arrays}
        self.c = {n: down.arrays[C + n] for n in self.params}
        self.ci = {n: state.arrays.get(CI + n, np.zeros_like(c)) for n, c in self.c.items()}
        self.correction = {n: self.on_device(self.c[n] - self.ci[n]) for n in self.params}
        self.step_sizes = 0.0  # K eta_l

    def before_step(self, model: nn.Module) -> None:
        """g_i(y_i) + c - c_i (Alg. 1 line 10)."""
        for n, p in self.params.items():
            if p.grad is None:
                p.grad = self.correction[n].clone()
            else:
                p.grad.add_(self.correction[n])
        group = self.opt.optimizer.param_groups[0]
        self.step_sizes += group["lr"] / (1.0 - group.get("momentum", 0.0))  # heavy ball: eta / (1 - beta)

    def prepare(self, down, state, data, seed):
        model = super().prepare(down, state, data, seed)
        self.start = model_arrays(model, self.shared)  # x, the server model
        return model

    def local_update(self, model, state, data, seed):
        self.opt = self.optimizer(model, self.trained_parts, state)  # before_step reads its learning rate
        return self.train(model, self.opt, data, seed), (self.opt,)

    def reply(self, model, data, loss):
        """Delta y_i and Delta c_i (Alg. 1 lines 12-13), c_i+ by option II."""
        x, y = self.start, model_arrays(model, self.shared)
        self.ci_new = {  # option II (line 12); no step taken (no data): c_i is kept
            n: (self.ci[n] - self.c[n] + (x[n] - y[n]) / self.step_sizes).astype(self.ci[n].dtype)
            if self.step_sizes else self.ci[n]
            for n in self.params
        }
        up = {**{k: y[k] - x[k] for k in x}, **{C + n: self.ci_new[n] - self.ci[n] for n in self.params}}
        return Record(up, {"num_examples": len(data.train), "loss": loss})

    # ---- clients trained together (engine: batched) -----------------------------------------
    trains_together = True

    def fit_together(self, jobs):
        """``fit`` of every job at once, each client's gradients corrected by its own ``c - c_i``;
        equal to ``fit`` up to float rounding (tests/test_batched.py)."""
        names, work, variates = self.parameter_names(), [], []
        for down, state, data, seed in jobs:
            job = self.client_job(down, state, data, seed, "model", names)
            self.begin_fit(self.model, down, state)
            job.correction = self.correction
            work.append(job)
            variates.append((self.params, self.c, self.ci))
        o = self.task.training.optimizer
        out = []
        for job, res, (_, state, data, _), variate in zip(work, self.train_together(work), jobs, variates, strict=True):
            self.params, self.c, self.ci = variate  # as begin_fit left them for this client
            self.start = {n: job.weights[n].numpy().copy() for n in self.parameter_names(self.shared)}
            self.step_sizes = res.steps * o.lr / (1.0 - o.momentum)  # K eta_l, as before_step sums it
            load_arrays(self.model, {n: host(w) for n, w in res.weights.items()})
            up = self.reply(self.model, data, res.loss)
            kept = self.kept_together(state, model_arrays(self.model, PARTS), {"model": res.momentum})
            kept.arrays.update({CI + n: v for n, v in self.ci_new.items()})
            out.append((up, kept))
        return out

    def client_state(self, model, *opts):
        """FedAvg's, plus c_i+."""
        kept = super().client_state(model, *opts)
        kept.arrays.update({CI + n: v for n, v in self.ci_new.items()})
        return kept


__all__ = ["Scaffold"]
