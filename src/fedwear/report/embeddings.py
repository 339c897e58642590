"""``fedwear report --embeddings``: t-SNE of the body embeddings of each method (ProtoHAR, Cheng et
al., IEEE JBHI 2023, Fig. 4).

For the run with the lowest seed of each method: its config (config.yaml), its data
(``dataset.root``, or ``--root``), its last checkpoint (checkpoint.npz) and its method. Every
training client's own test windows go through that client's model as the run evaluates it in
the personalized view at the checkpoint's round (``evaluation_message`` and the engine's own
:func:`fedwear.engines.client.evaluated_predictors`; a method with fine-tuning budgets: its last
budget's model, view ``personalized@<budget>``), and ``pred.body`` gives their embeddings (the
features the head classifies). One t-SNE per method over all clients' embeddings pooled; one
panel per method, points coloured by true class. A method whose evaluation keeps a state on
the client (Meta-HAR, FedMAT, a persisted fine-tuning optimiser) is personalised once more
from the state its last evaluation kept, and the caption says so.

The panels' points are saved beside the figure (``embeddings-tsne.json``): a later report into
the same folder draws a finished run's panel from there, without its checkpoint (a run folder
kept without checkpoints, as ``results/runs/`` keeps them), as long as the run's config and
final round are still those the points came from.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.lines import Line2D

from fedwear import files
from fedwear.callbacks import CHECKPOINT, load_checkpoint
from fedwear.config import RunConfig, load_config
from fedwear.data import dataset_module, load_federated
from fedwear.data.preprocess import bundled_root
from fedwear.data.types import ClientData, FederatedData
from fedwear.engines.client import evaluated_predictors, forward, view_name
from fedwear.engines.store import saved_states
from fedwear.errors import FedwearError
from fedwear.evaluation.predictor import Predictor
from fedwear.methods import Method, Record, Task, build_method
from fedwear.report.plots import Groups, Plot, _new_figure, _save
from fedwear.report.rundir import Run, load_run

FILE = "embeddings-tsne.png"
POINTS = "embeddings-tsne.json"  # the panels' points, beside the figure
PERPLEXITY = 30
TSNE_TEXT = ("scikit-learn TSNE(n_components=2, init='pca', random_state=0, "
             f"perplexity=min({PERPLEXITY}, n-1)) with n the panel's windows")


@dataclass
class Embeddings:
    """Body embeddings of every training client's test windows, from one run's checkpoint."""

    method: str
    seed: int | str
    round: int
    final_round: object
    model: str  # which model each client used, in words
    z: np.ndarray  # [n, d] embeddings, clients one after another
    y: np.ndarray  # [n] true class
    client: np.ndarray  # [n] client id
    class_names: list[str]
    data: str = ""  # where the windows came from, in words
    colour: str = "true class"  # what ``y`` holds: "client" for a regression run (no classes)
    view: str = "personalized"  # the metrics.csv view of the drawn models (:func:`drawn_view`)
    kept: bool = False  # personalised once more from what the evaluation kept (:func:`personal_model`)


@dataclass
class Panel:
    """One method's t-SNE panel: its points and what the caption says of them."""

    method: str
    seed: int | str
    round: int
    final_round: object
    config_hash: str
    model: str
    data: str
    colour: str
    class_names: list[str]
    dim: int  # the embeddings' dimension
    xy: np.ndarray  # [n, 2] t-SNE coordinates
    y: np.ndarray  # [n] colour index: true class, or client for a regression run
    client: np.ndarray  # [n] client id
    view: str = "personalized"
    kept: bool = False

    def to_json(self) -> dict:
        return {**asdict(self), "xy": self.xy.tolist(), "y": self.y.tolist(),
                "client": self.client.tolist()}

    @classmethod
    def from_json(cls, d: dict) -> Panel:
        return cls(**{**d, "xy": np.asarray(d["xy"], float).reshape(-1, 2), "y": np.asarray(d["y"], int),
                      "client": np.asarray(d["client"], dtype=object)})


@dataclass
class Skipped:
    method: str
    seed: int | str
    reason: str


# ---- config and data ------------------------------------------------------------------------
def run_config(run_dir: Path, root: Path | None = None) -> RunConfig:
    """The run's config.yaml, with ``dataset.root`` replaced by ``root`` when given; a one-line
    error when the data folder it names is missing (a generated dataset needs none)."""
    path = Path(run_dir) / files.CONFIG
    cfg = load_config(path)
    if root is not None:
        cfg = cfg.model_copy(update={"dataset": cfg.dataset.model_copy(update={"root": str(root)})})
    name, folder = cfg.dataset.name, cfg.dataset.root
    if getattr(dataset_module(name), "GENERATED", False):
        return cfg
    fix = f"pass --root /path/to/{name} (the folder of the data the run was trained on)"
    if folder is None and bundled_root(name) is None:
        raise FedwearError(f"{path}: dataset.root is not set for dataset '{name}'; {fix}")
    if folder is not None and not Path(folder).expanduser().is_dir():
        key = "--root" if root is not None else "dataset.root"
        raise FedwearError(f"{path}: {key} {folder!r} (dataset '{name}') does not exist or is not "
                           f"a folder; {fix}")
    return cfg


def load_data(cfg: RunConfig) -> FederatedData:
    """The run's federated data, as ``fedwear.run`` builds it."""
    seed = cfg.dataset.seed if cfg.dataset.seed is not None else cfg.seed
    return load_federated(cfg.dataset, seed)


def data_text(cfg: RunConfig) -> str:
    """The dataset and the folder its windows were read from."""
    name = cfg.dataset.name
    if getattr(dataset_module(name), "GENERATED", False):
        return f"{name} (generated, no files)"
    if cfg.dataset.root is None:
        return f"{name}, the subset bundled with fedwear"
    return f"{name} from {cfg.dataset.root}"


def class_names(cfg: RunConfig, data: FederatedData) -> list[str]:
    """Names of the class indices: the data's (the loader's CLASS_NAMES after any
    ``dataset.classes`` selection), else the dataset module's CLASS_NAMES, else the indices."""
    k = data.num_classes
    for names in (data.class_names, getattr(dataset_module(cfg.dataset.name), "CLASS_NAMES", None)):
        if names is not None and len(names) >= k:
            return [str(n) for n in list(names)[:k]]
    return [str(i) for i in range(k)]


# ---- embeddings -----------------------------------------------------------------------------
def model_text(m: Method) -> str:
    """Which weights a client's body and head come from, in words."""
    if m.task.training.personal_model == "trained" and m.rebuilt_by_fit():
        return "each client's model right after its latest local training (evaluation.personal_model: trained)"
    shared, personal = tuple(getattr(m, "shared", ())), tuple(getattr(m, "personal", ()))
    parts = []
    if shared:
        same = not personal and m.same_model_for_all
        parts.append(f"{' and '.join(shared)} from the server's message to that client"
                     + (" (the same global model for every client)" if same else ""))
    if personal:
        parts.append(f"{' and '.join(personal)} the client's own (its saved client state)")
    return "; ".join(parts) or "the method's personal predictor"


def missing_states(m: Method, checkpoint: dict) -> str | None:
    """Why the personal predictors cannot be rebuilt from ``checkpoint`` (its client states are
    missing though the method keeps personal parts on the clients), or None."""
    states = checkpoint.get("clients") or {}
    if getattr(m, "personal", ()) and not states:
        return "its checkpoint holds no client states (the personal parts live on the clients)"
    rebuilt = m.rebuilt_by_fit()
    if rebuilt and any(not any(k.startswith(rebuilt) for k in st.arrays) for st in states.values()):
        return ("its checkpoint leaves out the trained models the next round rebuilds (a paused run): "
                "report it once it has finished")
    return None


def drawn_budget(m: Method) -> str:
    """The fine-tuning budget whose model a figure draws: the method's last (the most
    fine-tuning: FedReptile's k3, Meta-HAR's n3, FedMAT's e4), ``""`` without budgets."""
    return m.budgets[-1] if m.budgets else ""


def drawn_view(m: Method) -> str:
    """The metrics.csv view of the model a figure draws (``personalized@<budget>``)."""
    return view_name("personalized", drawn_budget(m))


def personal_model(m: Method, checkpoint: dict, client: ClientData, cfg: RunConfig
                   ) -> tuple[Predictor | Callable | None, bool]:
    """The predictor the run evaluates ``client`` (a training client) with in :func:`drawn_view`
    at ``checkpoint["round"]``, from the checkpoint's server and client state, through the
    engine's own choice (:func:`fedwear.engines.client.evaluated_predictors`: ``personalize``
    seeded as the run seeds it, each budget's state, ``personal_model: trained``); None when the
    method has none.

    And whether the method's evaluation keeps a state on the client (``Personalized.keep``:
    Meta-HAR's head, FedMAT's masks and head, a persisted fine-tuning optimiser). The checkpoint
    holds the states after its round's evaluation, so such a method's predictor is personalised
    once more from what that evaluation kept: not the model metrics.csv scored."""
    server, round = checkpoint["server"], checkpoint["round"]
    cid = client.client_id
    state = (checkpoint.get("clients") or {}).get(cid, Record())
    down = m.evaluation_message(server, cid, round)
    personal, keep = evaluated_predictors(m, down, state, client, cfg, round)
    # a predictor is valid until the method builds the next one: the last budget's is read last
    return next((pred for budget, pred in personal if budget == drawn_budget(m)), None), keep is not None


def client_predictor(m: Method, checkpoint: dict, client: ClientData, cfg: RunConfig
                     ) -> Predictor | Callable | None:
    """:func:`personal_model`'s predictor."""
    return personal_model(m, checkpoint, client, cfg)[0]


@dataclass
class Bodies:
    """Per client id, the body embeddings of its test windows; ``kept``: the method's evaluation
    keeps a state on the clients (see :func:`personal_model`)."""

    z: dict[str, np.ndarray]
    kept: bool = False


def body_embeddings(m: Method, checkpoint: dict, clients: list[ClientData], cfg: RunConfig) -> Bodies | str:
    """Per client id: ``pred.body`` of its test windows, with the predictor the run evaluates
    that client with in :func:`drawn_view` at ``checkpoint["round"]`` (:func:`personal_model`);
    or why there is none."""
    if why := missing_states(m, checkpoint):
        return why
    out = Bodies({})
    for c in clients:
        pred, kept = personal_model(m, checkpoint, c, cfg)
        out.kept |= kept
        if not isinstance(pred, Predictor) or pred.head is None:
            return ("its personal predictor has no separate body (no features before a head)"
                    if pred is not None else "it has no personal predictor")
        z = forward(pred.body, c.test.x, cfg.evaluation.batch_size, pred.device).float().numpy()
        out.z[c.client_id] = z.reshape(len(z), -1)
    return out


def run_embeddings(run: Run, root: Path | None = None,
                   data_cache: dict | None = None) -> Embeddings | Skipped:
    """The body embeddings of ``run`` (see :func:`body_embeddings`), or why it is skipped."""
    restored = restore(run, root, data_cache)
    if isinstance(restored, Skipped):
        return restored
    cfg, ckpt, method, data = restored.cfg, restored.checkpoint, restored.method, restored.data
    bodies = body_embeddings(method, ckpt, data.clients, cfg)
    if isinstance(bodies, str):
        return Skipped(run.method, run.seed, bodies)
    per_client = bodies.z
    ids = list(per_client)
    sizes = [len(per_client[c]) for c in ids]
    if data.kind == "regression":  # a forecast target has no class: colour by client
        colour = {"y": np.repeat(np.arange(len(ids)), sizes), "class_names": ids, "colour": "client"}
    else:
        by_id = {c.client_id: c for c in data.clients}
        y = np.concatenate([by_id[c].test.y for c in ids]).astype(int) if ids else np.zeros(0, int)
        colour = {"y": y, "class_names": class_names(cfg, data)}
    return Embeddings(
        method=run.method, seed=run.seed, round=int(ckpt["round"]),
        final_round=run.summary.get("final_round"), model=model_text(method),
        z=np.concatenate([per_client[c] for c in ids]) if ids else np.zeros((0, 0), np.float32),
        client=np.repeat(np.array(ids, dtype=object), sizes), data=data_text(cfg),
        view=drawn_view(method), kept=bodies.kept, **colour,
    )


@dataclass
class Restored:
    """A run rebuilt from its directory: config, last checkpoint (client states read, also
    from ``client_states: disk`` files), method and data."""

    run: Run
    cfg: RunConfig
    checkpoint: dict
    method: Method
    data: FederatedData


def restore(run: Run, root: Path | None = None, data_cache: dict | None = None
            ) -> Restored | Skipped:
    """``run``'s config, checkpoint.npz, method (not wrapped: ``privacy.dp`` changes training, not
    the evaluated model) and data (shared between runs of the same data settings through
    ``data_cache``), or why it cannot be rebuilt (no checkpoint, a checkpoint of another config, a
    wrapper method). A missing data folder raises :class:`FedwearError` (see :func:`run_config`)."""
    ckpt_path = run.path / CHECKPOINT
    if not ckpt_path.is_file():
        return Skipped(run.method, run.seed, f"no {CHECKPOINT} in {run.path.name} "
                       "(checkpoint_every=0, or it was removed)")
    cfg = run_config(run.path, root)
    ckpt = load_checkpoint(ckpt_path)
    if ckpt.get("config_hash") != cfg.hash():
        return Skipped(run.method, run.seed, f"{CHECKPOINT} belongs to another config "
                       "(its config hash differs from config.yaml's)")
    cache = {} if data_cache is None else data_cache
    key = (cfg.dataset.model_dump_json(), cfg.dataset.seed if cfg.dataset.seed is not None else cfg.seed)
    if key not in cache:
        cache[key] = load_data(cfg)
    data = cache[key]
    m = build_method(Task.of(cfg, data))
    if not all(callable(getattr(m, h, None)) for h in ("configure", "personalize", "personal_predictor")):
        return Skipped(run.method, run.seed, "it is a wrapper without the evaluation hooks")
    ckpt["clients"] = saved_states(ckpt.get("clients") or {}, run.path)  # client_states=disk: files
    return Restored(run, cfg, ckpt, m, data)


def restore_run(path: Path, root: Path | None = None) -> Restored:
    """:func:`restore` of the run folder ``path``, or a one-line FedwearError saying why it
    cannot be rebuilt (what the analysis scripts need)."""
    out = restore(load_run(path), root)
    if isinstance(out, Skipped):
        raise FedwearError(f"{path}: {out.reason}")
    return out


# ---- t-SNE and the figure -------------------------------------------------------------------
def tsne(z: np.ndarray) -> np.ndarray:
    """2-D t-SNE of ``z`` with the settings of :data:`TSNE_TEXT`, on one OpenMP thread: the
    Barnes-Hut sums then run in a fixed order (the same figure every time), and OpenMP's
    spinning threads do not stall on cores shared with other runs (54 points: 0.3 s on one
    thread, 30 s on two busy cores)."""
    from sklearn.manifold import TSNE
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="openmp"):
        return TSNE(n_components=2, init="pca", random_state=0,
                    perplexity=min(PERPLEXITY, len(z) - 1)).fit_transform(np.asarray(z, np.float64))


def _class_color(k: int, n_classes: int):
    return f"C{k % 10}" if n_classes <= 10 else colormaps["tab20"](k % 20)


def _why_not_tsne(e: Embeddings) -> str | None:
    if len(e.z) < 2:
        return "fewer than 2 test windows"
    if e.z.shape[1] < 2:
        return f"{e.z.shape[1]}-dimensional embeddings (t-SNE with init='pca' needs 2)"
    if not np.isfinite(e.z).all():
        return "its embeddings hold NaN or inf (the model diverged)"
    return None


def draw_skipped(ax, title: str, reason: str, width: int = 34) -> None:
    """An empty panel titled ``title`` that says why it has nothing to show."""
    ax.set_title(title)
    ax.text(0.5, 0.5, "skipped:\n" + textwrap.fill(reason, width), ha="center", va="center",
            color="#555", transform=ax.transAxes)


def _saved_panels(out: Path) -> dict[tuple[str, str], Panel]:
    """The panels an earlier report saved in ``out`` (none when the file is missing or unreadable)."""
    try:
        saved = json.loads((out / POINTS).read_text())
        return {(p["method"], str(p["seed"])): Panel.from_json(p) for p in saved["panels"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _still_valid(panel: Panel | None, run: Run) -> bool:
    """``panel`` shows ``run`` as it is: a finished run of the same config and final round."""
    if panel is None or run.unfinished:
        return False
    try:
        same_config = load_config(run.path / files.CONFIG).hash() == panel.config_hash
    except FedwearError:
        return False
    return same_config and panel.final_round == run.summary.get("final_round")


def run_panel(run: Run, root: Path | None, data_cache: dict) -> Panel | Skipped:
    """``run``'s t-SNE panel, from its checkpoint (see :func:`run_embeddings`), or why there is none."""
    r = run_embeddings(run, root, data_cache)
    if isinstance(r, Embeddings) and (why := _why_not_tsne(r)):
        r = Skipped(r.method, r.seed, why)
    if isinstance(r, Skipped):
        return r
    xy = np.round(tsne(r.z).astype(float), 5)  # as saved: a redrawn panel is the same
    return Panel(method=r.method, seed=r.seed, round=r.round, final_round=r.final_round,
                 config_hash=load_config(run.path / files.CONFIG).hash(), model=r.model, data=r.data,
                 colour=r.colour, class_names=r.class_names, dim=int(r.z.shape[1]), xy=xy,
                 y=np.asarray(r.y, int), client=r.client, view=r.view, kept=r.kept)


def embedding_plot(groups: Groups, out: Path, root: Path | None = None) -> Plot:
    """``embeddings-tsne.png``: one t-SNE panel per method (lowest seed), in group order; the
    points go to ``embeddings-tsne.json``, from which a later report redraws a panel whose run is
    unchanged (see the module's docstring)."""
    saved = _saved_panels(out)
    cache: dict = {}
    results: dict[str, Panel | Skipped] = {}
    for method, runs in groups.items():
        kept = saved.get((runs[0].method, str(runs[0].seed)))
        results[method] = kept if _still_valid(kept, runs[0]) else run_panel(runs[0], root, cache)
    cache.clear()
    panels = [r for r in results.values() if isinstance(r, Panel)]
    (out / POINTS).write_text(json.dumps({"figure": FILE, "tsne": TSNE_TEXT,
                                          "panels": [p.to_json() for p in panels]}))
    n_classes = max((len(p.class_names) for p in panels), default=0)
    names = panels[0].class_names if panels else []
    legend = panels[0].colour if panels else "true class"

    cols = min(4, len(results))
    rows = math.ceil(len(results) / cols)
    fig = _new_figure(3.3 * cols, 3.2 * rows + (0.5 if n_classes else 0.0))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[len(results):]:
        ax.set_axis_off()
    for ax, (method, r) in zip(axes, results.items(), strict=False):
        ax.set(xticks=[], yticks=[])
        if isinstance(r, Skipped):
            draw_skipped(ax, f"{method} (seed {r.seed})", r.reason)
            continue
        colors = [_class_color(int(k), n_classes) for k in r.y]
        ax.scatter(r.xy[:, 0], r.xy[:, 1], s=3, c=colors, linewidths=0, alpha=0.8)
        ax.set_title(f"{method} (seed {r.seed}, round {r.round})\n{len(set(r.client))} clients, "
                     f"{len(r.xy)} test windows")
    if n_classes:
        handles = [Line2D([], [], ls="", marker="o", markersize=5, color=_class_color(k, n_classes))
                   for k in range(n_classes)]
        labels = [f"{k}: {names[k]}" if k < len(names) and names[k] != str(k) else str(k)
                  for k in range(n_classes)]
        fig.legend(handles, labels, loc="outside lower center", frameon=False,
                   ncol=min(n_classes, 6, 2 * cols), title=legend)
    _save(fig, out, FILE)
    by = "the client" if legend == "client" else "true class"
    return Plot(FILE, "t-SNE of body embeddings", "t-SNE of each method's body embeddings of test windows, "
                f"coloured by {by} (ProtoHAR Fig. 4).", "embeddings", notes=caption(results))


def round_note(round: int, final_round: object) -> str:
    """How a checkpoint's round stands to the run's last evaluated round (summary.json's
    ``final_round``, None before the first evaluation), in a caption's words."""
    if final_round is None:
        return "no round evaluated yet"
    return "the final round" if final_round == round else f"the run's final round is {final_round}"


def caption(results: dict[str, Panel | Skipped]) -> str:
    """What the figure shows: checkpoint round, windows, model per client, t-SNE settings."""
    done = {m: r for m, r in results.items() if isinstance(r, Panel)}
    parts = [
        "t-SNE of body embeddings (ProtoHAR, Cheng et al. 2023, Fig. 4): the output of the model's "
        "body (the features the classifier head receives) for every training client's own "
        "test-split windows (held-out new clients excluded), each client's windows through the "
        "model that client is evaluated with in the personalized view (a method with fine-tuning "
        "budgets: its last budget's, personalized@<budget>) at the checkpoint's round; "
        "one panel per method, the run with the lowest seed of each method; colour: true class."
    ]
    if any(r.colour == "client" for r in done.values()):
        parts.append("Regression runs (a forecast target has no class): colour: the client.")
    for method, r in done.items():
        final = round_note(r.round, r.final_round)
        parts.append(
            f"{method} seed {r.seed}: {CHECKPOINT} of round {r.round} ({final}); model per "
            f"client: {r.model}; data: {r.data}; {len(set(r.client))} clients, {len(r.xy)} windows, "
            f"{r.dim}-dimensional embeddings, t-SNE perplexity "
            f"{min(PERPLEXITY, len(r.xy) - 1)}; view {r.view}."
        )
        if r.kept:
            parts.append(
                f"{method}'s evaluation keeps a state on each client (its head, masks or fine-tuning "
                f"optimiser) and the checkpoint holds it as round {r.round}'s evaluation left it, so "
                f"these models are personalised once more from there: not the ones metrics.csv "
                f"scores as {r.view} at round {r.round}."
            )
    parts.append(f"The points of each panel are in {POINTS}. Each panel is its own t-SNE of all its clients' embeddings pooled: {TSNE_TEXT}; "
                 "the axes have no units and the panels are not aligned with each other.")
    parts += [f"Skipped {m} seed {r.seed}: {r.reason}." for m, r in results.items()
              if isinstance(r, Skipped)]
    return " ".join(parts)
