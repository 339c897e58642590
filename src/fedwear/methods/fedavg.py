"""FedAvg (McMahan et al., AISTATS 2017, Algorithm 1): the base every method subclasses.

Subclasses override only what differs: the ``shared`` / ``personal`` part declarations, the
``loss``, ``begin_fit``, ``before_step`` / ``after_step`` hooks, ``configure`` / ``aggregate``
or the predictors.
"""

from __future__ import annotations

import logging
import math
from functools import cached_property
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedwear.data.types import ClientData
from fedwear.errors import FedwearError
from fedwear.evaluation.predictor import Predictor, digest
from fedwear.methods import batched
from fedwear.methods.api import FitJob, Method, Plan, Record, Task
from fedwear.methods.api import Options as BaseOptions
from fedwear.methods.footprint import tensor_bytes
from fedwear.methods.training import (
    LocalOptimizer,
    LossFn,
    host,
    load_arrays,
    make_optimizer,
    model_arrays,
    part_parameters,
    train_epochs,
    weighted_mean,
)
from fedwear.models import SplitModel, build_model

log = logging.getLogger("fedwear")
PARTS = ("body", "head")
#: Prefix of the client's trained model in its state (``evaluation.personal_model: trained``).
TRAINED = "trained."
#: Hooks that define a client's round: a class overriding any of them trains client by client
#: (``trains_together`` is then False) unless it declares how it trains together.
STEP_HOOKS = ("fit", "fit_together", "prepare", "local_update", "reply", "trained_parts", "load", "begin_fit", "optimizer", "train",
              "loss", "before_step", "after_step", "client_state")
#: Per device, above this many training FLOPs per window clients train one after another even
#: with ``engine: batched``. On the CPU the step is then compute-bound and batching saves nothing
#: (``benchmarks/batched_crossover.py``, docs/performance.md). On a GPU one client's step leaves
#: most of the chip idle at any size fedwear's models reach, so clients always train together
#: there (``benchmarks/batched_crossover.py --device cuda`` measures it).
VECTORIZE_MAX_TRAIN_FLOPS = {"cpu": 2e6, "cuda": math.inf}


class FedAvg(Method):
    name = "fedavg"
    devices = ("cpu", "cuda")
    summary = "FedAvg (McMahan et al. 2017): clients train the whole model; the server averages it weighted by sample counts."

    same_model_for_all = True  # configure: the global model, to every client (a subclass overriding it says)
    #: Model parts sent to clients and averaged by the server.
    shared: ClassVar[tuple[str, ...]] = PARTS
    #: Model parts a client trains and keeps between rounds (never sent).
    personal: ClassVar[tuple[str, ...]] = ()
    #: The server state is a mean of the replied arrays (central DP and secure aggregation apply).
    mean_aggregation: ClassVar[bool] = True
    #: mu of a proximal term ``mu / 2 ||w - w_global||^2`` that the local loss adds (FedProx):
    #: ``train_together`` adds it too.
    proximal_weight: float = 0.0
    #: Prefixes of client-state keys that ``fit`` keeps as they were (Meta-HAR's user head).
    carried: ClassVar[tuple[str, ...]] = ()
    #: ``fit_together`` reproduces ``fit``, so ``engine: batched`` may train a round's clients
    #: together. Derived when the class is defined: True when it overrides none of the
    #: ``STEP_HOOKS`` and its bases train together (FedAvg's step; FedProx's adds only
    #: ``proximal_weight``, which the vectorised step adds too). A class with its own
    #: ``fit_together`` declares it (ProtoHAR, FedProto).
    trains_together: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "trains_together" not in cls.__dict__:
            cls.trains_together = not any(h in cls.__dict__ for h in STEP_HOOKS) and all(
                base.trains_together for base in cls.__bases__ if issubclass(base, FedAvg))

    def __init__(self, task: Task, options: BaseOptions) -> None:
        super().__init__(task, options)
        cfg = task.training
        self.model: SplitModel = self.new_model()
        self.initial = model_arrays(self.model, PARTS)
        self.local_epochs = cfg.local_epochs
        self.batch_size = cfg.batch_size
        self.batch_dependent_outputs = self.model.batch_dependent

    # ---- model helpers ------------------------------------------------------------------
    def new_model(self) -> SplitModel:
        """The model, initialised deterministically from the run seed (same on every client)."""
        cfg = self.task.training
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            return build_model(
                cfg.model, self.task.window, self.task.channels, self.task.num_outputs,
                **cfg.model_options,
            ).to(self.device)

    def on_device(self, a: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        """An array as a tensor on the model's device (no copy on the CPU)."""
        return torch.from_numpy(np.asarray(a)).to(self.device, dtype)

    def load(self, down: Record, state: Record) -> SplitModel:
        """Reuse the one model object: initial weights, then the server's parts, then the
        client's own (a client's personal copy of a part wins over the server's)."""
        load_arrays(self.model, {**self.initial, **down.arrays, **state.arrays})
        return self.model

    def optimizer(self, model: nn.Module, parts: tuple[str, ...], state: Record, name: str = "model",
                  lr: float | None = None, scheduled: bool = True) -> LocalOptimizer:
        """A named optimiser over ``parts``; restored from ``state`` when ``optimizer.persist``
        (one optimiser per client kept across rounds: ProtoHAR's code, cheng-haha/ProtoHAR useravg.py). ``scheduled=False``
        holds the learning rate the schedule has reached and never steps it (Meta-HAR's
        fine-tuning steps the user's optimiser but not its scheduler, Chain123/Meta-HAR met-har.py); the kept
        scheduler position is then left as it was."""
        o = self.task.training.optimizer
        opt = make_optimizer(part_parameters(model, parts), o.name, lr or o.lr, o.momentum, o.weight_decay, o.eps)
        sched = None
        if o.scheduler == "step":
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=o.step_size, gamma=o.gamma)
        local = LocalOptimizer(name, opt, sched)
        if o.persist:
            local.load_state_arrays(state.arrays)
        return local if scheduled else LocalOptimizer(name, opt)

    def train(self, model: nn.Module, opt: LocalOptimizer, data: ClientData, seed: int,
              epochs: int | None = None, loss_fn: LossFn | None = None, x: torch.Tensor | None = None,
              y: torch.Tensor | None = None, shuffle: bool = True, clip: bool = True) -> float:
        """Local epochs over ``(x, y)`` (default: the client's train split) with the hooks;
        gradients clipped at ``grad_clip`` unless ``clip`` is off."""
        if x is None or y is None:
            x, y = tensors(data)
        x, y = x.to(self.device), y.to(self.device)  # no copy on the CPU
        self.training_bytes = max(self.training_bytes, tensor_bytes(self))
        return train_epochs(
            model, opt.optimizer, x, y,
            epochs=self.local_epochs if epochs is None else epochs,
            batch_size=self.batch_size,
            generator=torch.Generator().manual_seed(seed),
            loss_fn=loss_fn or self.loss,
            clip=self.task.training.grad_clip if clip else None,
            shuffle=shuffle,
            drop_last=self.task.training.drop_last,
            before_step=lambda: self.before_step(model),
            after_step=lambda: self.after_step(model),
            after_epoch=opt.end_epoch,
        )

    # ---- server -------------------------------------------------------------------------
    def init_server(self) -> Record:
        """The initial weights of the ``shared`` parts."""
        return Record({k: a for k, a in self.initial.items() if k.split(".", 1)[0] in self.shared})

    def configure(self, server: Record, client: str, round: int) -> Record:
        return Record(server.arrays)

    def aggregate(self, server: Record, replies: dict[str, Record], round: int, plan: Plan | None = None) -> Record:
        if not replies:
            return server
        keys = [k for k in server.arrays if k in next(iter(replies.values())).arrays]
        return Record({**server.arrays, **weighted_mean(replies.values(), keys)}, dict(server.scalars))

    def global_message(self, server: Record) -> Record | None:
        """The whole model when every part is shared; otherwise there is no global model."""
        return Record(server.arrays) if set(PARTS) <= set(self.shared) else None

    # ---- client -------------------------------------------------------------------------
    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Local objective; FedProx, MOON, ProtoHAR... override this hook."""
        return self.criterion(model(x), y)

    def criterion(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The task's loss on model outputs: cross-entropy, or for regression the mean squared
        error of the single output (PCFedH's predictor loss, Eq. 11)."""
        if self.task.kind == "regression":
            return F.mse_loss(out.squeeze(-1), y)
        return F.cross_entropy(out, y)

    def begin_fit(self, model: nn.Module, down: Record, state: Record) -> None:
        """Called after the model is loaded and before local training (e.g. keep w_global)."""

    def before_step(self, model: nn.Module) -> None:
        """Called after backward (and clipping), before each optimiser step (SCAFFOLD)."""

    def after_step(self, model: nn.Module) -> None:
        """Called after each optimiser step (e.g. a running average of the weights)."""

    def fit(self, down, state, data, round, seed):
        """A client's round (Alg. 1's ClientUpdate), the template every method fills in: the model
        to train (``prepare``), local training (``local_update``), what is sent (``reply``) and
        what is kept (``client_state``, plus the ``carried`` keys of the state as they were)."""
        torch.manual_seed(seed)
        model = self.prepare(down, state, data, seed)
        loss, opts = self.local_update(model, state, data, seed)
        up = self.reply(model, data, loss)
        return up, self.carry(state, self.client_state(model, *opts))

    def prepare(self, down: Record, state: Record, data: ClientData, seed: int) -> SplitModel:
        """The model the client trains: ``load``, then ``begin_fit``."""
        model = self.load(down, state)
        self.begin_fit(model, down, state)
        return model

    def local_update(self, model: SplitModel, state: Record, data: ClientData,
                     seed: int) -> tuple[float, tuple[LocalOptimizer, ...]]:
        """Local training: ``local_epochs`` of one optimiser over ``trained_parts``; returns the
        mean loss and the optimisers (whose state ``client_state`` keeps)."""
        opt = self.optimizer(model, self.trained_parts, state)
        return self.train(model, opt, data, seed), (opt,)

    @property
    def trained_parts(self) -> tuple[str, ...]:
        """The model parts ``local_update`` trains: the shared and the personal ones."""
        return self.shared + self.personal

    def reply(self, model: SplitModel, data: ClientData, loss: float) -> Record:
        """What the client sends: its ``shared`` parts, its train windows and its mean loss."""
        return Record(model_arrays(model, self.shared), {"num_examples": len(data.train), "loss": loss})

    def carry(self, state: Record, kept: Record) -> Record:
        """``kept`` plus the ``carried`` keys of the client's previous ``state``."""
        if self.carried:
            kept.arrays.update({k: v for k, v in state.arrays.items() if k.startswith(self.carried)})
        return kept

    def fit_many(self, jobs: list[FitJob], round: int) -> list[tuple[Record, Record]]:
        """``fit`` of several clients in one vectorised computation (``fit_together``) when the
        class's step allows it on this model (``vectorizable``); otherwise one after another."""
        if not self.vectorizable:
            return super().fit_many(jobs, round)
        return self.fit_together(jobs)

    def fit_together(self, jobs: list[FitJob], **step) -> list[tuple[Record, Record]]:
        """FedAvg's ``fit`` of every job at once (``methods/batched.py``; ``step``: more arguments
        of ``train_together``): equal to it up to float rounding. A class that declares
        ``trains_together`` with its own step overrides this."""
        names = self.parameter_names()
        work = [self.client_job(down, state, data, seed, "model", names) for down, state, data, seed in jobs]
        out = []
        for (_, state, data, _), res in zip(jobs, self.train_together(work, **step), strict=True):
            arrays = {n: host(w).copy() for n, w in res.weights.items()}
            up = self.reply_together(arrays, data, res.loss)
            out.append((up, self.kept_together(state, arrays, {"model": res.momentum})))
        return out

    def reply_together(self, arrays: dict[str, np.ndarray], data: ClientData, loss: float) -> Record:
        """``reply``'s record for a client trained together: its ``shared`` parts of ``arrays``,
        its train windows and its mean loss."""
        return Record({n: a for n, a in arrays.items() if n.split(".", 1)[0] in self.shared},
                      {"num_examples": len(data.train), "loss": loss})

    def parameter_names(self, parts: tuple[str, ...] = PARTS) -> list[str]:
        """Names of the model's parameters in ``parts``, in the order an optimiser holds them."""
        prefixes = tuple(f"{p}." for p in parts)
        return [n for n, _ in self.model.named_parameters() if n.startswith(prefixes)]

    def client_job(self, down: Record, state: Record, data: ClientData, seed: int, optimizer: str,
                   trained: list[str]) -> batched.ClientJob:
        """A job for ``train_together``: the weights ``load`` would give, the client's train split
        and the momentum buffers of its optimiser ``optimizer`` over ``trained``."""
        start = {**self.initial, **down.arrays, **state.arrays}
        weights = {n: torch.from_numpy(np.asarray(start[n])) for n in self.parameter_names()}
        return batched.ClientJob(weights, *tensors(data), seed, self.kept_momentum(state, optimizer, trained))

    def kept_momentum(self, state: Record, optimizer: str, trained: list[str]) -> dict[str, torch.Tensor] | None:
        """The momentum buffers the client's optimiser ``optimizer`` over ``trained`` kept
        (``optimizer.persist``), by parameter name; None when it has none yet."""
        buffers = [state.arrays.get(f"optim.{optimizer}.{i}.momentum_buffer") for i in range(len(trained))]
        if not self.task.training.optimizer.persist or any(b is None for b in buffers):
            return None
        return {n: torch.from_numpy(np.array(b)) for n, b in zip(trained, buffers, strict=True)}

    def kept_together(self, state: Record, arrays: dict[str, np.ndarray],
                      momenta: dict[str, dict[str, torch.Tensor]]) -> Record:
        """What ``fit`` keeps (``client_state``, then ``carry``) from clients trained together: the
        ``personal`` parts of ``arrays``, the momentum buffers of each named optimiser when
        ``optimizer.persist``, the whole model under ``trained.`` when asked."""
        kept = {n: a for n, a in arrays.items() if n.split(".", 1)[0] in self.personal}
        if self.keeps_trained:
            kept.update({TRAINED + n: a for n, a in arrays.items()})
        if self.task.training.optimizer.persist:
            for name, buffers in momenta.items():
                kept.update({f"optim.{name}.{i}.momentum_buffer": host(b).copy() for i, b in enumerate(buffers.values())})
        return self.carry(state, Record(kept))

    def train_together(self, work: list[batched.ClientJob], **step) -> list[batched.ClientResult]:
        """:func:`batched.train_together` of the jobs with the run's optimiser, epochs and loss
        (``step`` overrides or adds arguments); on a GPU in chunks of at most ``_max_together``
        clients, halved whenever the GPU runs out of memory (the clients are independent: their
        numbers do not depend on the chunks)."""
        cfg = self.task.training
        o = cfg.optimizer
        step = {"epochs": self.local_epochs, "batch_size": self.batch_size, "lr": o.lr, "momentum": o.momentum,
                "weight_decay": o.weight_decay, "clip": cfg.grad_clip, "regression": self.task.kind == "regression",
                "proximal": self.proximal_weight, **step}
        results: list[batched.ClientResult] = []
        while len(results) < len(work):
            chunk = work[len(results):len(results) + self._max_together]
            try:
                results += batched.train_together(self.model, chunk, **step)
            except torch.cuda.OutOfMemoryError:
                if len(chunk) == 1:
                    raise FedwearError(f"device=cuda: one client's training does not fit in the GPU's memory "
                                       f"(batch_size={self.batch_size}); lower batch_size or use device=cpu") from None
                self._max_together = max(1, len(chunk) // 2)
                torch.cuda.empty_cache()
                log.warning("engine=batched: %d clients did not fit in the GPU's memory together; training at most "
                            "%d at once from now on", len(chunk), self._max_together)
        return results

    #: How many clients ``train_together`` trains at once (halved on a GPU out of memory).
    _max_together: int = 1 << 30

    @cached_property
    def vectorizable(self) -> bool:
        """Whether ``fit_many`` can train clients together: the class's step (``trains_together``), SGD
        without a scheduler in fp32, every parameter trained, a pure model (no buffers or
        dropout) small enough for batching to pay on its device (``VECTORIZE_MAX_TRAIN_FLOPS``)."""
        o, t = self.task.training.optimizer, self.task
        trained = set(self.trained_parts)
        return (
            self.trains_together and not self.task.training.drop_last and self.task.training.precision == "fp32"
            and o.name == "sgd" and o.scheduler == "none"
            and all(n.split(".", 1)[0] in trained for n, _ in self.model.named_parameters())
            and batched.can_vectorize(self.model)
            and batched.train_flops_per_window(self.model, t.window, t.channels, t.num_outputs)
            <= VECTORIZE_MAX_TRAIN_FLOPS[torch.device(self.device).type]
        )

    def client_state(self, model: nn.Module, *opts: LocalOptimizer) -> Record:
        """The ``personal`` parts, plus each optimiser's state when ``optimizer.persist``, plus the
        whole trained model under ``trained.`` when ``evaluation.personal_model: trained``."""
        arrays = model_arrays(model, self.personal)
        if self.task.training.optimizer.persist:
            for opt in opts:
                arrays.update(opt.state_arrays())
        if self.keeps_trained:
            arrays.update({TRAINED + k: v for k, v in model_arrays(model, PARTS).items()})
        return Record(arrays)

    @property
    def keeps_trained(self) -> bool:
        return self.task.training.personal_model == "trained"

    def rebuilt_by_fit(self) -> tuple[str, ...]:
        """The ``trained.`` model: every ``fit`` replaces it and none reads it."""
        return (TRAINED,) if self.keeps_trained else ()

    def trained_predictor(self, state: Record) -> Predictor | None:
        """The model the client holds after its latest local training (``trained.`` in its state)."""
        trained = {k[len(TRAINED):]: v for k, v in state.arrays.items() if k.startswith(TRAINED)}
        return self.predictor(self.load(Record(), Record(trained))) if trained else None

    # ---- evaluation ---------------------------------------------------------------------
    # A predictor reuses the method's one model object: it is valid until the next call.
    def personal_predictor(self, down: Record, state: Record) -> Predictor | None:
        """Each client's own model: the shared parts from the server, its personal parts."""
        return self.predictor(self.load(down, state))

    def global_predictor(self, message: Record) -> Predictor:
        return self.predictor(self.load(message, Record()))

    def predictor(self, model: SplitModel) -> Predictor:
        """Body and head of ``model``, keyed by their current weights (equal weights, shared work)."""
        model.eval()
        state = model.state_dict()
        keys = {part: digest((k, v.detach().cpu().numpy()) for k, v in state.items() if k.startswith(part + "."))
                for part in PARTS}
        return Predictor(model.features, model.head, keys["body"], keys["head"], self.device)

    def adapt(self, down: Record, data: ClientData, seed: int) -> Record:
        """FedAvg has no adaptation: a new client uses the global model as it is."""
        return Record()

    def train_personal(self, down: Record, data: ClientData, seed: int, parts: tuple[str, ...],
                       loss_fn: LossFn | None = None, lr: float | None = None) -> Record:
        """Adaptation by training ``parts`` for ``evaluation.adapt_epochs`` epochs from ``down``."""
        torch.manual_seed(seed)
        model = self.load(down, Record())
        opt = self.optimizer(model, parts, Record(), lr=lr)
        self.train(model, opt, data, seed, epochs=self.task.training.adapt_epochs, loss_fn=loss_fn)
        return Record(model_arrays(model, self.personal))


def tensors(data: ClientData) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-copy torch views of a client's train split (cached on the split object)."""
    w = data.train
    cached = getattr(w, "_torch", None)
    if cached is None:
        cached = (torch.from_numpy(np.ascontiguousarray(w.x)), torch.from_numpy(w.y))
        object.__setattr__(w, "_torch", cached)
    return cached


__all__ = ["TRAINED", "FedAvg", "tensors"]
