"""The method contract: what every federated method implements, whatever the engine.

A method never sees threads, sockets or Flower. It works on :class:`Record` values
(named numpy arrays + a few scalars): a *message* crosses the network, the *server state*
stays on the server, a *client state* stays on a client between rounds. The engine
drives one round as::

    clients = m.select(server, round, scheduled, all_clients)   # or Selection(clients, plan)
    for c in clients:                                   # sequential, vectorised or remote
        down = m.configure(server, c, round)
        up, state[c] = m.fit(down, state[c], data[c], round, seed(c, round))
    server = m.aggregate(server, {c: up_c}, round, plan)

and evaluates, in the rounds ``m.evaluation_due`` names, with ``personalize`` + ``personal_predictor`` (personalized and
generalization views), ``global_message`` + ``global_predictor`` (global view) and
``adapt`` + ``personal_predictor`` (new clients). ``docs/architecture.md`` maps the five
seed methods and their baselines onto these hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from fedwear.evaluation.predictor import Predictor

if TYPE_CHECKING:
    from fedwear.data.types import ClientData, FederatedData

Scalar = int | float | str | bool
#: One client's ``fit`` arguments: (down, state, data, seed).
FitJob = tuple["Record", "Record", "ClientData", int]
#: Groups of a round's clients that ``select`` hands to ``aggregate`` (PCFedH: cluster -> drawn clients).
Plan = dict[str, list[str]]
#: The reply scalar every ``fit`` sends: the client's number of train windows, which aggregation
#: may weight it by (1 under central DP, whose mean is equal-weight, and for the mean SecAgg+ returns).
WEIGHT = "num_examples"


@dataclass
class Selection:
    """What ``select`` returns when ``aggregate`` must know why each client was drawn."""

    clients: list[str]
    plan: Plan


@dataclass
class Personalized:
    """What ``personalize`` (or ``adapt``) returns when the state to evaluate is not the state to
    keep (Meta-HAR's code keeps a user's classifier between evaluations), or when the method
    evaluates several fine-tuning budgets: ``evaluate`` maps each budget of ``Method.budgets``
    (``""`` when it has none) to the state evaluated with it; ``keep`` is the client's state from
    now on (None: unchanged; ignored for new clients, which keep nothing)."""

    evaluate: dict[str, Record]
    keep: Record | None = None


@dataclass(frozen=True)
class ClusterSpace:
    """Where a clustering method places windows (:meth:`Method.cluster_space`): ``encode`` maps
    ``[n, window, channels]`` windows to ``[n, q]`` features (None: the raw windows, flattened),
    ``prototypes`` ``[K, q]`` are the global prototypes, ``text`` names the encoder in words."""

    encode: Callable[[np.ndarray], np.ndarray] | None
    prototypes: np.ndarray
    text: str


@dataclass(frozen=True)
class Phase:
    """A named span of rounds (``first`` to ``last``, inclusive) that cost alike: the progress bar
    estimates each phase from its own rounds (PCFedH's clustering rounds take minutes, its
    soft-clustering rounds seconds)."""

    name: str
    first: int
    last: int


@dataclass
class Record:
    """Named numpy arrays plus scalars. Bytes on the wire are the sum of the arrays' sizes."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    scalars: dict[str, Scalar] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays.values()))


class Options(BaseModel):
    """Base of every method's options (``method_options.<name>`` in a config)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


@dataclass(frozen=True)
class Training:
    """The settings of a run that a method reads, taken from its config by :meth:`of`; a method
    never sees the rest of the config (where the data lives, the engine, tracking...)."""

    method: str
    options: dict[str, Any]  # method_options.<method>, validated by the method's Options
    seed: int
    rounds: int
    local_epochs: int
    batch_size: int
    drop_last: bool
    grad_clip: float | None
    device: str  # cpu or cuda (``auto`` resolved by :attr:`Method.device`)
    precision: str
    compile: bool | str  # torch.compile the model's body and head (True, or the mode "reduce-overhead")
    model: str
    model_options: dict[str, Any]
    optimizer: Any  # the config's ``optimizer`` block: name, lr, momentum, weight_decay, persist, ...
    eval_batch_size: int
    personal_model: str  # evaluation.personal_model
    adapt_epochs: int  # evaluation.adapt_epochs
    dp: str  # privacy.dp

    @staticmethod
    def of(config) -> Training:
        """From a :class:`fedwear.config.RunConfig` (read by attribute: the method layer does not
        import the config's)."""
        ev = config.evaluation
        return Training(config.method, dict(config.method_options.get(config.method) or {}), config.seed,
                        config.rounds, config.local_epochs, config.batch_size, config.drop_last, config.grad_clip,
                        config.device, config.precision, config.compile, config.model.name, dict(config.model.options),
                        config.optimizer, ev.batch_size, ev.personal_model, ev.adapt_epochs, config.privacy.dp)


@dataclass
class Task:
    """What a method needs to know about the data and the run, nothing engine-specific.

    ``kind`` is ``classification`` or ``regression``; ``target`` maps a regression output back
    to the target's units (``value * scale + shift``, :class:`fedwear.data.types.FederatedData`).
    """

    training: Training
    window: int
    channels: int
    num_classes: int  # 0 for regression
    num_clients: int  # clients that train, as partitioned (SCAFFOLD's server step: |S| / N)
    kind: str = "classification"
    target: tuple[float, float] = (0.0, 1.0)
    #: Each client's own classes (its train labels, sorted): a per-client label space (Meta-HAR's
    #: C_u heads). Empty for regression.
    client_classes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def num_outputs(self) -> int:
        """Model outputs: one per class, or one regression output."""
        return 1 if self.kind == "regression" else self.num_classes

    @staticmethod
    def of(config, data: FederatedData) -> Task:
        """The task of a run's config (a :class:`fedwear.config.RunConfig`) on ``data``."""
        return Task(Training.of(config), data.window, len(data.channels), data.num_classes, len(data.clients),
                    data.kind, tuple(data.target), client_classes(data))


def client_classes(data: FederatedData) -> dict[str, tuple[int, ...]]:
    """Each client's own classes: the sorted labels of its train split (none for regression)."""
    if data.kind == "regression":
        return {}
    return {c.client_id: tuple(int(k) for k in np.unique(c.train.y)) for c in [*data.clients, *data.new_clients]}


class Method:
    """Base contract. Concrete methods subclass :class:`fedwear.methods.fedavg.FedAvg`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    Options: ClassVar[type[Options]] = Options
    #: Task kinds the method handles; one tied to class labels declares ``("classification",)``.
    kinds: ClassVar[tuple[str, ...]] = ("classification", "regression")
    #: Named fine-tuning budgets evaluated side by side (Meta-HAR's n in {1, 2, 3}, FedMAT's e in
    #: {2, 4}): each gives views ``personalized@<budget>`` ... through :class:`Personalized`.
    budgets: ClassVar[tuple[str, ...]] = ()
    #: Devices the method runs on (``device`` in a config). Inherited: FedAvg and its subclasses
    #: run on ``cuda`` too; a subclass with tensors it does not place on the model's device opts
    #: out with ``devices = ("cpu",)``.
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    #: Peak bytes of the tensors the method held in its last ``fit`` (``methods/footprint.py``;
    #: 0: not measured). ``FedAvg.train`` measures it, the engine reports it in ``rounds.csv``.
    training_bytes: int = 0
    #: A round's clients are the run's up-front schedule (``select`` is not overridden), so the
    #: engine knows them before the round (a checkpoint then leaves out what their fit rebuilds).
    #: Derived once when a class is defined, unless the class sets it.
    static_selection: ClassVar[bool] = True
    #: The server state is a mean of the replied arrays: central DP, SecAgg+ and the robust rules
    #: may wrap the method.
    mean_aggregation: ClassVar[bool] = False
    #: The server steps towards the mean of the replied arrays (Reptile: ``theta + s (mean - theta)``,
    #: s <= 1): central DP adds its noise to that mean, before the step.
    mean_step: ClassVar[bool] = False
    #: Why central DP (``privacy.dp``) cannot wrap the method, when it cannot (``fedwear methods``).
    no_dp_reason: ClassVar[str] = "its server does not aggregate by a mean of the clients' arrays"
    #: Central DP by parts (:meth:`dp_parts`): how many Gaussian sums a round releases (0: none;
    #: the mean of the clipped update is then the only one).
    dp_part_count: ClassVar[int] = 0
    #: A model's outputs depend on the other windows of its batch (HART's code-faithful LiteFormer):
    #: each window set is then evaluated in its own batches, never cut from a pooled pass.
    batch_dependent_outputs: bool = False

    @classmethod
    def private(cls) -> bool:
        """Whether central DP can wrap the method (see :attr:`no_dp_reason` when not)."""
        return cls.mean_aggregation or cls.mean_step or cls.dp_part_count > 0

    # ---- central DP by parts (methods whose server combines several sums: prototypes) ---------
    def dp_bounds(self, settings) -> dict[str, float]:
        """Each part's L2 bound: a client's part is clipped to it and the server's sum of the part
        gets Gaussian noise of std z times it (``settings``: the config's ``privacy`` block)."""
        raise NotImplementedError

    def dp_parts(self, down: Record, up: Record) -> dict[str, dict[str, np.ndarray]]:
        """A reply as the vectors the server sums, per part of :meth:`dp_bounds` (unclipped)."""
        raise NotImplementedError

    def dp_aggregate(self, server: Record, sums: dict[str, dict[str, np.ndarray]], clients: int) -> Record:
        """The server state from the noisy sums of each part over the round's ``clients`` replies."""
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "static_selection" not in cls.__dict__:
            cls.static_selection = "select" not in cls.__dict__ and all(
                getattr(base, "static_selection", True) for base in cls.__bases__)

    def __init__(self, task: Task, options: Options) -> None:
        self.task = task
        self.options = options

    @property
    def device(self) -> str:
        """The torch device the method's tensors live on: the config's ``device``; ``auto`` is
        cuda when torch sees a GPU and the class declares it in ``devices``, else cpu."""
        wanted = self.task.training.device
        if wanted == "auto":
            import torch

            return "cuda" if "cuda" in self.devices and torch.cuda.is_available() else "cpu"
        return wanted

    # ---- data -------------------------------------------------------------------------
    def training_clients(self, data: FederatedData) -> list[ClientData]:
        """The clients that train. Centralized pools them; everything else keeps them."""
        return data.clients

    # ---- server side ------------------------------------------------------------------
    def init_server(self) -> Record:
        raise NotImplementedError

    def select(self, server: Record, round: int, scheduled: list[str], all_clients: list[str]
               ) -> list[str] | Selection:
        """Clients of this round. Default: the run's up-front schedule (same for all methods).

        Methods whose selection depends on server state (PCFedH's v-weighted draw per
        cluster) draw from ``derive_seed(seed, "select", round)`` and may return a
        :class:`Selection` whose ``plan`` reaches ``aggregate``.
        """
        return scheduled

    def configure(self, server: Record, client: str, round: int) -> Record:
        raise NotImplementedError

    def aggregate(self, server: Record, replies: dict[str, Record], round: int, plan: Plan | None = None) -> Record:
        """The next server state from the accepted replies (``plan``: from ``select``, if any)."""
        raise NotImplementedError

    def phases(self, rounds: int) -> list[Phase]:
        """The run's phases, in round order, covering rounds 1..``rounds``. Default: one."""
        return [Phase("training", 1, rounds)]

    def evaluation_due(self, round: int, every: int, last: int) -> bool:
        """Whether round ``round`` is evaluated (``evaluation.every``, ``rounds``). Default: every
        ``every`` rounds and the last; a method with phases counts from its evaluated phase."""
        return round % every == 0 or round == last

    def evaluation_message(self, server: Record, client: str, round: int) -> Record:
        """What a client is sent to be evaluated with. Default: its training message
        (SCAFFOLD leaves out the control variate)."""
        return self.configure(server, client, round)

    def global_message(self, server: Record) -> Record | None:
        """The shared model as a message, or None when the method has no global model."""
        return None

    # ---- client side ------------------------------------------------------------------
    def fit(
        self, down: Record, state: Record, data: ClientData, round: int, seed: int
    ) -> tuple[Record, Record]:
        raise NotImplementedError

    def fit_many(self, jobs: list[FitJob], round: int) -> list[tuple[Record, Record]]:
        """``fit`` of several clients (``engine: batched``); a method may train them together.
        Default: one after another."""
        return [self.fit(down, state, data, round, seed) for down, state, data, seed in jobs]

    def personalize(self, down: Record, state: Record, data: ClientData, seed: int) -> Record | Personalized:
        """Client state to evaluate a training client with. Default: its state as kept.

        Meta-HAR and FedMAT fine-tune from the current global embedding here before testing; a
        :class:`Personalized` answer evaluates one state per budget and may change the kept one.
        """
        return state

    def personal_predictor(self, down: Record, state: Record) -> Predictor | None:
        return None

    def global_predictor(self, message: Record) -> Predictor:
        raise NotImplementedError

    #: Whether :meth:`cluster_space` can give one (the report then draws it, or says why not).
    has_cluster_space: ClassVar[bool] = False
    #: Whether ``configure`` sends every client the same model (FedAvg's global model).
    same_model_for_all: ClassVar[bool] = False

    def cluster_space(self, arrays: dict[str, np.ndarray]) -> ClusterSpace | str | None:
        """The features the method clusters windows on, from a checkpoint's server ``arrays``, with
        the global prototypes (PCFedH's Fig. 3 draws them), or why they cannot be rebuilt; None
        when the state holds none. Default: none."""
        return None

    def rebuilt_by_fit(self) -> tuple[str, ...]:
        """Prefixes of client-state keys that the client's next ``fit`` writes anew without reading
        them (FedAvg's ``trained.`` model): a checkpoint leaves them out for the clients whose next
        round starts with their fit (:class:`fedwear.callbacks.Checkpointer`). Default: none."""
        return ()

    def trained_predictor(self, state: Record) -> Predictor | None:
        """The model a client holds right after its latest local training, when its state keeps it
        (``evaluation.personal_model: trained``); None otherwise."""
        return None

    def adapt(self, down: Record, data: ClientData, seed: int) -> Record | Personalized:
        """Client state of a client that never trained, after the method's own adaptation (one
        per budget through :class:`Personalized`)."""
        return Record()

    # ---- checks shared by engines -------------------------------------------------------
    def validate_reply(self, down: Record, reply: Record) -> str | None:
        """Why a client's reply is malformed (names, shapes, a dtype that is not a real number type
        or is not floating point where the method's own array of that name is, non-finite values),
        or None. The
        round loop checks the scalars it reads itself, the weight ``num_examples`` first
        (:func:`fedwear.engines.runner.reply_problem`), so an override need not."""
        expected = self.reply_spec(down)
        if set(reply.arrays) != set(expected):
            missing = sorted(set(expected) - set(reply.arrays))
            extra = sorted(set(reply.arrays) - set(expected))
            return f"array names differ (missing {missing[:3]}, unexpected {extra[:3]})"
        known = {**getattr(self, "initial", {}), **down.arrays}  # what the method started from, then sent
        for key, shape in expected.items():
            a = np.asarray(reply.arrays[key])
            if a.dtype.kind not in "fiub":  # complex, object, text: nothing a method sends
                return f"array {key!r} has dtype {a.dtype}, not a real number type"
            if key in known and np.asarray(known[key]).dtype.kind == "f" and a.dtype.kind != "f":
                return f"array {key!r} has dtype {a.dtype}, expected floating point as sent"
            if shape is not None and tuple(a.shape) != tuple(shape):
                return f"array {key!r} has shape {tuple(a.shape)}, expected {tuple(shape)}"
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                return f"array {key!r} holds NaN or inf"
        return None

    def reply_spec(self, down: Record) -> dict[str, tuple[int, ...] | None]:
        """Names and shapes a reply to ``down`` must have (None: any shape)."""
        return {k: v.shape for k, v in down.arrays.items()}
