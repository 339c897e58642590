"""What one client does, identical under every engine: train, and evaluate the views."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import torch

from fedwear.config import RunConfig
from fedwear.data.types import ClientData, Windows
from fedwear.evaluation.metrics import classification_metrics, confusion_counts, regression_metrics
from fedwear.evaluation.naive import naive_forecasts
from fedwear.evaluation.predictor import Predictor, as_predictor
from fedwear.methods.api import Method, Personalized, Record
from fedwear.methods.training import autocast
from fedwear.seeding import derive_seed

Row = dict[str, object]
#: Logit of a class outside a client's own label space (probability 0 after softmax, ranked last).
ABSENT_LOGIT = -1e9
#: Reply scalar: peak bytes of the tensors the method held while training (``methods/footprint.py``).
TRAINING_BYTES = "training_bytes"
#: Key of a classification row's confusion counts: the row-major ``[true, predicted]`` counts of
#: the row's windows over the task's classes, a tuple of ``num_classes**2`` ints. Not a metric:
#: the round loop takes it out of the row, pools it over clients into ``confusion.csv``
#: (``RoundInfo.confusion``), and it is not counted in ``eval_bytes_up``.
CONFUSION = "confusion"
#: The ``client`` of the ``global_pooled`` view's one row per round (it has no train split: n_train 0).
POOLED = "pooled"


def view_name(view: str, budget: str) -> str:
    """``personalized`` or, for a named fine-tuning budget, ``personalized@<budget>``."""
    return f"{view}@{budget}" if budget else view


def as_personalized(result: Record | Personalized) -> tuple[dict[str, Record], Record | None]:
    """``personalize`` / ``adapt``'s answer as {budget: state to evaluate} and the state to keep."""
    if isinstance(result, Personalized):
        return result.evaluate, result.keep
    return {"": result}, None


def evaluated_predictors(method: Method, down: Record, state: Record, data: ClientData, cfg: RunConfig,
                         round: int, *, new: bool = False, global_msg: Record | None = None
                         ) -> tuple[Iterator[tuple[str, Predictor | Callable]], Record | None]:
    """The models a client is evaluated with at ``round``: one ``(budget, predictor)`` pair per
    fine-tuning budget (``""`` for a method without budgets), and the client state to keep from
    now on (None: unchanged).

    The one place that decides what is evaluated, so the engine's numbers and any later look at
    a run's models (``fedwear report``'s figures) see the same model. A training client
    (personalized and generalization views): ``personalize`` seeded with ``("personalize",
    round, client)``, each budget's state through ``personal_predictor``, or the client's
    ``trained_predictor`` for ``evaluation.personal_model: trained``. A new client (``new``,
    ``down`` from :meth:`Method.evaluation_message`, ``state`` ignored): ``adapt`` seeded with
    ``("adapt", round, client)``, falling back on the global model of ``global_msg`` when the
    method has no personal predictor. Budgets without a predictor are left out.

    ``personalize``/``adapt`` run at once; the predictors are built one at a time as the pairs
    are read: a predictor is valid until the method loads the next model, so use each before
    reading the next.
    """
    cid = data.client_id
    if new:
        adapted, _ = as_personalized(method.adapt(down, data, derive_seed(cfg.seed, "adapt", round, cid)))
        return _adapted(method, down, adapted, global_msg), None
    states, keep = as_personalized(method.personalize(down, state, data, derive_seed(cfg.seed, "personalize", round, cid)))
    trained = method.trained_predictor(state) if cfg.evaluation.personal_model == "trained" else None
    return _personal(method, down, states, trained), keep


def _personal(method: Method, down: Record, states: dict[str, Record], trained: Predictor | None
              ) -> Iterator[tuple[str, Predictor | Callable]]:
    for budget, st in states.items():
        pred = trained if trained is not None else method.personal_predictor(down, st)
        if pred is not None:
            yield budget, pred


def _adapted(method: Method, down: Record, states: dict[str, Record], global_msg: Record | None
             ) -> Iterator[tuple[str, Predictor | Callable]]:
    for budget, st in states.items():
        pred = method.personal_predictor(down, st)
        if pred is None and global_msg is not None:
            pred = method.global_predictor(global_msg)
        if pred is not None:
            yield budget, pred


def is_number(v: object) -> bool:
    return isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool)


def whole_number(v: object) -> int | None:
    """``v`` as a whole number (an integer, or a float without a fraction), else None."""
    if not is_number(v):
        return None
    if isinstance(v, int | np.integer):
        return int(v)
    f = float(v)  # type: ignore[arg-type]
    return int(f) if math.isfinite(f) and f.is_integer() else None


def split_sizes(data: ClientData) -> tuple[int, int, int]:
    """A client's (train, test, val) windows: the ``n_train`` and ``n`` of its evaluation rows."""
    return len(data.train), len(data.test), len(data.val)


def row_client(row: Row, client: str) -> str:
    """The ``client`` column of a row that ``client`` computed."""
    return POOLED if row["view"] == "global_pooled" else client


@torch.no_grad()
def forward(fn, x: np.ndarray | torch.Tensor, batch_size: int, device: str = "cpu") -> torch.Tensor:
    """``fn`` over ``x`` in batches on ``device`` (no gradients, the process's precision:
    :func:`fedwear.methods.training.autocast`); the outputs on the CPU, copied there once."""
    xt = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
    xt = xt.to(device)  # no copy on the CPU
    with autocast(device):
        outs = [fn(xt[i : i + batch_size]) for i in range(0, len(xt), batch_size)]
    return (torch.cat(outs) if outs else torch.zeros(0, 0)).cpu()


class EvalCache:
    """Each distinct body's features, each distinct model's logits and metrics, once per round
    and window set.

    Keys come from the predictor (``body_key``, ``head_key``: digests of the weights), so clients
    of a global-model method share one forward pass per window set across the personalized,
    generalization and global views (and the metrics of equal logits on equal windows), and
    clients sharing a body share its features. A predictor without keys is computed every time.
    """

    def __init__(self) -> None:
        self._round: int | None = None
        self._features: dict[tuple, torch.Tensor] = {}
        self._logits: dict[tuple, np.ndarray] = {}
        self._scores: dict[tuple, dict[str, float]] = {}
        self.forwards = 0  # body passes actually run (for tests and benchmarks)

    def _at(self, round: int) -> None:
        if round != self._round:
            self._round, self._features, self._logits, self._scores = round, {}, {}, {}

    def scores(self, round: int, pred: Predictor, w: Windows, compute: Callable[[], dict[str, float]]) -> dict[str, float]:
        """``compute()`` (the metrics of ``pred`` on ``w``), once per keyed model and window set."""
        self._at(round)
        if pred.body_key is None or pred.head_key is None:
            return compute()
        key = (pred.body_key, pred.head_key, id(w))
        if key not in self._scores:
            self._scores[key] = compute()
        return self._scores[key]

    def logits(self, round: int, pred: Predictor, w: Windows, batch_size: int) -> np.ndarray:
        self._at(round)
        if pred.body_key is None:
            self.forwards += 1
            return forward(pred, w.x, batch_size, pred.device).float().numpy()
        lkey = (pred.body_key, pred.head_key, id(w))
        if pred.head_key is not None and lkey in self._logits:
            return self._logits[lkey]
        fkey = (pred.body_key, id(w))
        if fkey not in self._features:
            self.forwards += 1
            self._features[fkey] = forward(pred.body, w.x, batch_size, pred.device)
        z = self._features[fkey]
        logits = (z if pred.head is None else forward(pred.head, z, max(len(z), 1), pred.device)).float().numpy()
        if pred.head_key is not None:
            self._logits[lkey] = logits
        return logits


def _keyed_as(pred: Predictor | Callable, keys: tuple[str | None, str | None] | None) -> bool:
    """``pred`` is keyed, with these (body, head) keys: it computes those logits."""
    p = as_predictor(pred)
    return keys is not None and None not in keys and (p.body_key, p.head_key) == keys


class ClientRuntime:
    """One client: its data, and (for the generalization and global views) the pooled test set
    if available.

    ``own_slice`` locates the client's test split inside the pooled one. The global model's
    test logits are cut from its logits on the pooled test set (one forward pass in large
    batches for all clients instead of one per client), and so are a personal model's when it
    is the global model (same keys) or when the generalization view runs it over the pooled set
    anyway: each model runs over the test windows once.
    """

    def __init__(self, method: Method, data: ClientData, cfg: RunConfig, pooled_test: Windows | None = None,
                 cache: EvalCache | None = None, own_slice: slice | None = None):
        self.method = method
        self.data = data
        self.cfg = cfg
        self.pooled_test = pooled_test
        self.cache = cache or EvalCache()
        self.own_slice = own_slice if pooled_test is not None else None
        # batch-dependent outputs: each window set is run in its own batches (as Keras' evaluate)
        self.cut_from_pool = not method.batch_dependent_outputs
        self.pool_personal = "generalization" in cfg.evaluation.views
        # the first training client (its test split opens the pooled set) reports the pooled view
        self.reports_pool = self.own_slice is not None and self.own_slice.start == 0

    def fit_seed(self, round: int) -> int:
        return derive_seed(self.cfg.seed, "fit", round, self.data.client_id)

    def fit(self, down: Record, state: Record, round: int) -> tuple[Record, Record]:
        """The method's ``fit``; the reply carries the tensor bytes it held (``TRAINING_BYTES``)."""
        self.method.training_bytes = 0
        up, state = self.method.fit(down, state, self.data, round, self.fit_seed(round))
        if self.method.training_bytes:
            up = Record(up.arrays, {**up.scalars, TRAINING_BYTES: self.method.training_bytes})
        return up, state

    def evaluate(self, down: Record, state: Record, global_msg: Record | None, round: int, new: bool
                 ) -> tuple[list[Row], Record | None]:
        """Rows ``{view, split, n, n_train, <metrics>}`` for the views that apply: accuracy,
        macro_f1 and auc (and the :data:`CONFUSION` counts they come from), or for regression
        mse, mae and mape in the target's units together with the naive forecasts' rows (views
        ``last_value`` and ``client_mean``, beside every method); and the client state to keep
        from now on when ``personalize`` says so (else None).

        A method with fine-tuning budgets (``Method.budgets``) reports each as views of their own,
        ``personalized@<budget>``, ``generalization@<budget>`` and ``new_clients@<budget>``."""
        ev = self.cfg.evaluation
        m = self.method
        rows: list[Row] = []
        splits = ["test"] + (["val"] if ev.best_split == "val" else [])
        if new:
            if "new_clients" in ev.views:
                adapted, _ = evaluated_predictors(m, down, Record(), self.data, self.cfg, round, new=True,
                                                  global_msg=global_msg)
                for budget, pred in adapted:
                    rows += self._rows(round, pred, view_name("new_clients", budget), splits)
            return rows, None
        with_global = "global" in ev.views and global_msg is not None
        keep = None
        if {"personalized", "generalization"} & set(ev.views):
            # only the global model's keys: a predictor is valid until the method loads another model
            gpred = m.global_predictor(global_msg) if with_global and not self.pool_personal else None
            gkeys = (gpred.body_key, gpred.head_key) if gpred is not None else None
            personal, keep = evaluated_predictors(m, down, state, self.data, self.cfg, round)
            for budget, pred in personal:
                pooled = self.pool_personal or _keyed_as(pred, gkeys)
                if "personalized" in ev.views:
                    rows += self._rows(round, pred, view_name("personalized", budget), splits, pooled)
                if "generalization" in ev.views and self.pooled_test is not None:
                    rows.append(self._row(round, pred, view_name("generalization", budget), "test", self.pooled_test))
        if with_global:
            rows += self._rows(round, m.global_predictor(global_msg), "global", splits, pooled=True)
        if "global_pooled" in ev.views and global_msg is not None and self.reports_pool:
            # pooled macro-F1 (and AUC) cannot be rebuilt from per-client rows: one row, from the
            # first client, on the logits the global view computed over the pooled test set anyway
            row = self._row(round, m.global_predictor(global_msg), "global_pooled", "test", self.pooled_test)
            rows.append({**row, "n_train": 0})
        if m.task.kind == "regression" and "personalized" in ev.views:
            rows += self._naive_rows(splits)
        return rows, keep

    def _naive_rows(self, splits: list[str]) -> list[Row]:
        shift, scale = self.method.task.target
        out = []
        for s in splits:
            w = getattr(self.data, s)
            for view, pred in naive_forecasts(w.x[:, :, 0], self.data.train.y).items():
                metrics = regression_metrics(w.y * scale + shift, pred * scale + shift)
                out.append({"view": view, "split": s, "n": len(w), "n_train": len(self.data.train), **metrics})
        return out

    def _rows(self, round: int, pred: Predictor, view: str, splits: list[str], pooled: bool = False) -> list[Row]:
        return [self._row(round, pred, view, s, getattr(self.data, s), pooled) for s in splits]

    def _row(self, round: int, pred: Predictor, view: str, split: str, w: Windows, pooled: bool = False) -> Row:
        """``pooled``: cut the test logits from the model's logits on the pooled test set."""
        pred, bs = as_predictor(pred), self.cfg.evaluation.batch_size

        def compute() -> dict[str, float]:
            if pooled and w is self.data.test and self.own_slice is not None and self.cut_from_pool:
                logits = self.cache.logits(round, pred, self.pooled_test, bs)[self.own_slice]
            else:
                logits = self.cache.logits(round, pred, w, bs)
            task = self.method.task
            if pred.classes is not None:  # a head over the client's own classes: back to global labels
                full = np.full((len(logits), task.num_classes), ABSENT_LOGIT, np.float32)
                full[:, list(pred.classes)] = logits
                logits = full
            if task.kind == "regression":
                shift, scale = task.target
                return regression_metrics(w.y * scale + shift, logits.reshape(len(w), -1)[:, 0] * scale + shift)
            q = task.num_classes
            pred_y = logits.argmax(1) if len(w) else np.zeros(0, np.int64)
            counts = tuple(confusion_counts(w.y, pred_y, q).ravel().tolist())
            return {**classification_metrics(w.y, logits, self.cfg.evaluation.auc), CONFUSION: counts}

        metrics = self.cache.scores(round, pred, w, compute)
        return {"view": view, "split": split, "n": len(w), "n_train": len(self.data.train), **metrics}
