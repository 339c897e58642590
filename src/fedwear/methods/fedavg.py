"""FedAvg (McMahan et al., AISTATS 2017, Algorithm 1): the base every method subclasses.

Subclasses override only what differs: the ``shared`` / ``personal`` part declarations, the
``loss`` and its inputs (``prepare``), the ``stages`` of the local update, ``reply`` /
``client_state``, ``configure`` / ``aggregate`` or the predictors. A client's values travel in a
:class:`~fedwear.methods.fit.Fit`, never on the method object, so the same hooks train one client
(``fit``) or a round's clients together (``fit_many``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import cached_property
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedwear.data.types import ClientData
from fedwear.errors import FedwearError
from fedwear.evaluation.predictor import Predictor, digest
from fedwear.methods import together
from fedwear.methods.api import FitJob, Method, Plan, Record, Task
from fedwear.methods.api import Options as BaseOptions
from fedwear.methods.fit import Fit, Recorder, Stage, StageLoss, mean_loss
from fedwear.methods.footprint import tensor_bytes
from fedwear.methods.together import SGD, Client, Trained
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
#: Hooks whose override leaves the stages' frame: a class overriding any of them trains client by
#: client (``trains_together`` is then False) unless it declares otherwise.
STEP_HOOKS = ("fit", "local_update", "run_stage", "load", "optimizer", "train")
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
    #: Prefixes of client-state keys that ``fit`` keeps as they were (Meta-HAR's user head).
    carried: ClassVar[tuple[str, ...]] = ()
    #: ``engine: batched`` may train a round's clients together (``fit_many``): the local update is
    #: ``stages`` whose losses are functions of their arguments. Derived when the class is
    #: defined: True when it overrides none of the ``STEP_HOOKS`` and its bases train together; a
    #: class whose loss reads anything but ``fit.inputs`` or branches on tensor values says False.
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
            model = build_model(
                cfg.model, self.task.window, self.task.channels, self.task.num_outputs,
                **cfg.model_options,
            ).to(self.device)
        if cfg.compile:  # in place: the same module, parameters and state-dict names
            mode = cfg.compile if isinstance(cfg.compile, str) else None
            model.body.compile(mode=mode)
            model.head.compile(mode=mode)
        return model

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
              y: torch.Tensor | None = None, shuffle: bool = True, clip: bool = True, fit: Fit | None = None,
              after_epoch: Callable[[], None] | None = None) -> float:
        """Local epochs over ``(x, y)`` (default: the client's train split) of ``loss_fn`` (default:
        the method's ``loss`` with ``fit``); gradients clipped at ``grad_clip`` unless ``clip`` is
        off, then corrected by ``fit.correction``; ``fit.steps`` and ``fit.step_sizes`` count the
        steps; ``after_epoch`` runs after each epoch, after the optimiser's scheduler."""
        if x is None or y is None:
            x, y = tensors(data)
        x, y = x.to(self.device), y.to(self.device)  # no copy on the CPU
        self.training_bytes = max(self.training_bytes, tensor_bytes(self, fit))
        if loss_fn is None:
            def loss_fn(m, xb, yb):
                return mean_loss(self.loss(m, xb, yb, fit))
        group = opt.optimizer.param_groups[0]
        corrections = []
        if fit is not None and fit.correction:
            corrections = [(p, fit.correction[n]) for n, p in model.named_parameters() if n in fit.correction]

        def before_step() -> None:
            for p, c in corrections:
                if p.grad is None:
                    p.grad = c.clone()
                else:
                    p.grad.add_(c)
            if fit is not None:
                fit.steps += 1
                fit.step_sizes += group["lr"] / (1.0 - group.get("momentum", 0.0))  # heavy ball: eta / (1 - beta)

        return train_epochs(
            model, opt.optimizer, x, y,
            epochs=self.local_epochs if epochs is None else epochs,
            batch_size=self.batch_size,
            generator=torch.Generator().manual_seed(seed),
            loss_fn=loss_fn,
            clip=self.task.training.grad_clip if clip else None,
            shuffle=shuffle,
            drop_last=self.task.training.drop_last,
            before_step=before_step,
            after_epoch=opt.end_epoch if after_epoch is None else lambda: (opt.end_epoch(), after_epoch()),
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
    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, fit: Fit | None) -> torch.Tensor | tuple:
        """Local objective (a :data:`~fedwear.methods.fit.StageLoss`); FedProx, MOON, ProtoHAR...
        override this hook."""
        return self.criterion(model(x), y)

    def criterion(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The task's loss on model outputs: cross-entropy, or for regression the mean squared
        error of the single output (PCFedH's predictor loss, Eq. 11)."""
        if self.task.kind == "regression":
            return F.mse_loss(out.squeeze(-1), y)
        return F.cross_entropy(out, y)

    def fit(self, down, state, data, round, seed):
        """A client's round (Alg. 1's ClientUpdate), the template every method fills in: the model
        to train and the loss's inputs (``prepare``), local training (``local_update``), what is
        sent (``reply``) and what is kept (``client_state``, plus the ``carried`` keys of the state
        as they were). One :class:`Fit` carries the client's values through them."""
        torch.manual_seed(seed)
        fit = Fit(down, state, data, seed, round)
        self.prepare(fit)
        self.local_update(fit)
        return self.reply(fit), self.carry(state, self.client_state(fit))

    def prepare(self, fit: Fit) -> None:
        """The model the client trains, ``fit.model`` (the server's parts, then the client's own:
        ``load``), and what its loss reads (``fit.inputs``)."""
        fit.model = self.load(fit.down, fit.state)

    def stages(self, fit: Fit) -> list[Stage]:
        """The local update: ``local_epochs`` of one optimiser over ``trained_parts``."""
        return [Stage("model", self.trained_parts, self.loss, self.local_epochs)]

    def local_update(self, fit: Fit) -> None:
        """Each of ``stages`` in turn, client by client."""
        for stage in self.stages(fit):
            self.run_stage(fit, stage)

    def run_stage(self, fit: Fit, stage: Stage) -> None:
        """One stage on ``fit.model``: the other parts frozen, its optimiser's kept state restored,
        what it records in ``fit.recorded``, its mean loss in ``fit.loss``."""
        model = fit.model
        opt = self.optimizer(model, stage.parts, fit.state, name=stage.optimizer, lr=stage.lr)
        seed = stage.batch_seed(fit)
        recorder = Recorder(stage, fit)

        def loss_fn(m, xb, yb):
            return recorder.see(stage.loss(m, xb, yb, fit))

        prefixes = tuple(f"{p}." for p in stage.parts)
        frozen = [p for n, p in model.named_parameters() if not n.startswith(prefixes) and p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        try:
            fit.loss = self.train(model, opt, fit.data, seed, epochs=stage.epochs, loss_fn=loss_fn, fit=fit,
                                  after_epoch=recorder.end_epoch)
        finally:
            for p in frozen:
                p.requires_grad_(True)
        fit.optimizer_state.update(opt.state_arrays())
        recorder.close()

    @property
    def trained_parts(self) -> tuple[str, ...]:
        """The model parts the default stage trains: the shared and the personal ones."""
        return self.shared + self.personal

    def reply(self, fit: Fit) -> Record:
        """What the client sends: its ``shared`` parts, its train windows and its mean loss."""
        return Record(model_arrays(fit.model, self.shared), {"num_examples": len(fit.data.train), "loss": fit.loss})

    def carry(self, state: Record, kept: Record) -> Record:
        """``kept`` plus the ``carried`` keys of the client's previous ``state``."""
        if self.carried:
            kept.arrays.update({k: v for k, v in state.arrays.items() if k.startswith(self.carried)})
        return kept

    def client_state(self, fit: Fit) -> Record:
        """The ``personal`` parts, plus each stage's optimiser state when ``optimizer.persist``,
        plus the whole trained model under ``trained.`` when ``evaluation.personal_model: trained``."""
        arrays = model_arrays(fit.model, self.personal)
        if self.task.training.optimizer.persist:
            arrays.update(fit.optimizer_state)
        if self.keeps_trained:
            arrays.update({TRAINED + k: v for k, v in model_arrays(fit.model, PARTS).items()})
        return Record(arrays)

    # ---- clients trained together (engine: batched) ---------------------------------------
    def fit_many(self, jobs: list[FitJob], round: int) -> list[tuple[Record, Record]]:
        """``fit`` of several clients, their stages trained together (``methods/together.py``)
        when the class's step allows it on this model (``vectorizable``); otherwise one after
        another. Both run the same ``prepare``, ``stages``, ``reply`` and ``client_state``."""
        if not self.vectorizable:
            return super().fit_many(jobs, round)
        fits, starts = [], []
        for down, state, data, seed in jobs:
            torch.manual_seed(seed)  # as ``fit``
            fit = Fit(down, state, data, seed, round)
            self.prepare(fit)  # loads this client's start into the one model object
            fits.append(fit)
            starts.append({n: p.detach().clone() for n, p in fit.model.named_parameters()})
        train = together.POPULATION.get() or (lambda _, *args: self.train_together(*args))
        for stage in self.stages(fits[0]):
            results = train(self, stage, fits, starts)
            for fit, start, res in zip(fits, starts, results, strict=True):
                start.update(res.weights)
                fit.loss = res.loss
                fit.optimizer_state.update({f"optim.{stage.optimizer}.{i}.momentum_buffer": host(b).copy()
                                            for i, b in enumerate(res.momentum.values())})
        out = []
        for fit, start in zip(fits, starts, strict=True):
            load_arrays(self.model, {n: host(w) for n, w in start.items()})
            fit.model = self.model
            out.append((self.reply(fit), self.carry(fit.state, self.client_state(fit))))
        return out

    def train_together(self, stage: Stage, fits: list[Fit], starts: list[dict[str, torch.Tensor]]) -> list[Trained]:
        """:func:`together.train_together` of ``stage`` for ``fits`` from ``starts``; on a GPU in
        chunks of at most ``_max_together`` clients, halved whenever the GPU runs out of memory
        (the clients are independent: their numbers do not depend on the chunks)."""
        cfg = self.task.training
        o = cfg.optimizer
        sgd = SGD(stage.lr or o.lr, o.momentum, o.weight_decay, cfg.grad_clip, self.batch_size)
        prefixes = tuple(f"{p}." for p in stage.parts)
        trained = [n for n, _ in self.model.named_parameters() if n.startswith(prefixes)]
        clients = [Client(fit, start, *tensors(fit.data), stage.batch_seed(fit),
                          self.kept_momentum(fit.state, stage.optimizer, trained))
                   for fit, start in zip(fits, starts, strict=True)]
        results: list[Trained] = []
        while len(results) < len(clients):
            chunk = clients[len(results):len(results) + self._max_together]
            try:
                results += together.train_together(self.model, stage, chunk, sgd)
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

    def kept_momentum(self, state: Record, optimizer: str, trained: list[str]) -> dict[str, torch.Tensor] | None:
        """The momentum buffers the client's optimiser ``optimizer`` over ``trained`` kept
        (``optimizer.persist``), by parameter name; None when it has none yet."""
        buffers = [state.arrays.get(f"optim.{optimizer}.{i}.momentum_buffer") for i in range(len(trained))]
        if not self.task.training.optimizer.persist or any(b is None for b in buffers):
            return None
        return {n: torch.from_numpy(np.array(b)) for n, b in zip(trained, buffers, strict=True)}

    @cached_property
    def vectorizable(self) -> bool:
        """Whether ``fit_many`` can train clients together: the class's step (``trains_together``),
        SGD without a scheduler in fp32, uncompiled, a pure model (no buffers or dropout) small enough for
        batching to pay on its device (``VECTORIZE_MAX_TRAIN_FLOPS``)."""
        o, t = self.task.training.optimizer, self.task
        return (
            self.trains_together and not self.task.training.drop_last and self.task.training.precision == "fp32"
            and not self.task.training.compile
            and o.name == "sgd" and o.scheduler == "none"
            and together.can_vectorize(self.model)
            and together.train_flops_per_window(self.model, t.window, t.channels, t.num_outputs)
            <= VECTORIZE_MAX_TRAIN_FLOPS[torch.device(self.device).type]
        )

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
                       loss: StageLoss | None = None, lr: float | None = None, prepared: bool = False) -> Record:
        """Adaptation by training ``parts`` for ``evaluation.adapt_epochs`` epochs from ``down``
        with ``loss`` (default: the method's); ``prepared``: from ``prepare``'s model and inputs
        (FedProto's and FedPCL's prototypes), else from ``down`` as loaded."""
        torch.manual_seed(seed)
        fit = Fit(down, Record(), data, seed)
        if prepared:
            self.prepare(fit)
        else:
            fit.model = self.load(down, Record())
        opt = self.optimizer(fit.model, parts, Record(), lr=lr)
        objective = loss or self.loss
        self.train(fit.model, opt, data, seed, epochs=self.task.training.adapt_epochs, fit=fit,
                   loss_fn=lambda m, xb, yb: mean_loss(objective(m, xb, yb, fit)))
        return Record(model_arrays(fit.model, self.personal))


def tensors(data: ClientData) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-copy torch views of a client's train split (cached on the split object)."""
    w = data.train
    cached = getattr(w, "_torch", None)
    if cached is None:
        cached = (torch.from_numpy(np.ascontiguousarray(w.x)), torch.from_numpy(w.y))
        object.__setattr__(w, "_torch", cached)
    return cached


__all__ = ["TRAINED", "FedAvg", "tensors"]
