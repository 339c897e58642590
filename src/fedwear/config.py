"""The run configuration: one validated object, loaded from YAML with ``--set`` overrides.

Fixed keys scripts can rely on: ``method``, ``rounds``, ``clients_per_round``,
``local_epochs``, ``seed``, ``engine``, ``dataset.name``, ``dataset.root`` and
``method_options.<name>``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedwear.data.config import DatasetConfig
from fedwear.errors import ConfigError, did_you_mean
from fedwear.methods import METHODS, method_class, parse_options
from fedwear.models import parse_model_options
from fedwear.seeding import SEED_MAX

VIEWS = ("personalized", "generalization", "global", "global_pooled", "new_clients")
#: Views evaluated unless ``evaluation.views`` says otherwise.
DEFAULT_VIEWS = ("personalized", "generalization", "global", "new_clients")
#: Metrics per task kind (``evaluation/metrics.py``); the first picks the best round by default.
KIND_METRICS = {"classification": ("accuracy", "macro_f1", "auc"), "regression": ("mse", "mae", "mape")}
METRICS = KIND_METRICS["classification"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Strict):
    name: str = Field("cnn", description="cnn (small 1-D CNN), harcnn (ProtoHAR's CNN), hart (FedAli's transformer, "
                      "with ALP layers: options.alp), lstm (PCFedH's predictor), deepsense (Meta-HAR's embedding "
                      "network) or fedmat (FedMAT's shared and client networks)")
    options: dict[str, Any] = Field(
        default_factory=dict, description="options of the chosen model (checked per model; see docs/config.md)"
    )


class OptimizerConfig(Strict):
    name: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = Field(0.01, gt=0)
    eps: float = Field(1e-8, gt=0, description="Adam/AdamW epsilon: torch's 1e-8; Keras' 1e-7 for the FedAli protocol (getalp/FedAli runs Keras 2.15)")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum (ProtoHAR: 0.9)")
    weight_decay: float = Field(0.0, ge=0)
    persist: bool = Field(False, description="keep each client's optimiser state across rounds (ProtoHAR's code)")
    scheduler: Literal["none", "step"] = Field(
        "none", description="step: StepLR, stepped once per local epoch; its state persists with the optimiser's"
    )
    step_size: int = Field(1, ge=1, description="StepLR: epochs between learning-rate decays")
    gamma: float = Field(0.1, gt=0, le=1, description="StepLR: decay factor")


class EvaluationConfig(Strict):
    every: int = Field(1, ge=1, description="evaluate every N rounds (and always after the last)")
    views: list[Literal["personalized", "generalization", "global", "global_pooled", "new_clients"]] = Field(
        list(DEFAULT_VIEWS), min_length=1,
        description="views to evaluate (at least one); global_pooled: the global model on the pooled "
        "test set of all training clients, one row per round (client 'pooled'; FedAli's Global)",
    )
    auc: Literal["macro_ovr", "micro_logits"] = Field(
        "macro_ovr",
        description="macro one-vs-rest on softmax probabilities, or ProtoHAR's micro AUC on raw logits",
    )
    at_start: bool = Field(
        False, description="also evaluate before the first round (round 0), as ProtoHAR's code does"
    )
    client_weights: Literal["test", "train", "uniform"] = Field(
        "test",
        description="weights of the over-clients weighted mean: test windows (the papers' Eq.), "
        "train windows (ProtoHAR's serverbase.py) or uniform",
    )
    best_metric: str = Field(
        "personalized.accuracy",
        description="view.metric that picks the best round (a forecasting dataset's default: personalized.mse)",
    )
    best_statistic: Literal["weighted", "mean", "per_client"] = Field(
        "weighted",
        description="statistic over clients that best_metric maximises: weighted or unweighted mean; "
        "per_client: also each client's own best round (FedAli's Local keeps each client's best epoch "
        "on its test set: selection on test data), summarised in summary.json's per_client_best",
    )
    best_for: dict[str, str] = Field(
        default_factory=dict,
        description="view -> view.metric picking that view's own best round (e.g. {global: global.accuracy}); "
        "other views use best_metric's round",
    )
    best_split: Literal["test", "val"] = Field(
        "test", description="test: the papers' way (optimistic); val: needs dataset.val_fraction > 0"
    )
    personal_model: Literal["method", "trained"] = Field(
        "method",
        description="the model of the personalized and generalization views: the method's personal model, or "
        "trained: the model each client holds right after its latest local training (FedAli's protocol, "
        "getalp/FedAli: FedAvg's personalization is its locally trained model); a client that has not trained "
        "yet uses the method's",
    )
    targets: dict[str, float] = Field(default_factory=dict, description="view.metric -> value for rounds_to_target")
    adapt_epochs: int = Field(5, ge=0, description="training budget of a new client's adaptation")
    patience: int | None = Field(
        None, ge=1, description="stop after this many evaluations without a better best_metric (test split); null: never"
    )
    batch_size: int = Field(64, ge=1, description="evaluation batch (64: fastest for HARCNN on a CPU, see benchmarks)")


class SecAggConfig(Strict):
    """Flower's SecAgg+ (Bell et al. 2020) for methods that average client arrays (and, under central DP,
    every private method); Flower engines only."""

    enabled: bool = False
    num_shares: int | float = Field(1.0, description="neighbours each client shares keys with (int > 2, or a fraction)")
    reconstruction_threshold: int | float = Field(1.0, description="shares needed to reconstruct (int, or a fraction)")
    max_weight: float | None = Field(
        None, gt=0,
        description="largest client weight (train windows); null = the largest the nodes report (1 under central DP). "
        "Too large loses precision",
    )
    clipping_range: float = Field(8.0, gt=0, description="update entries are clipped to +-this before quantisation")


class FlowerConfig(Strict):
    """Settings of the Flower engines (``engine: flower-sim`` and deployment)."""

    round_timeout: float | None = Field(
        600.0, gt=0, description="seconds to wait for replies each round; missing replies are dropped"
    )
    min_nodes: int | None = Field(
        None, ge=1, description="nodes to wait for before round 1 (default: every client of the run)"
    )
    min_replies: float = Field(
        0.0, ge=0, le=1,
        description="fraction of a round's clients whose valid replies are needed to aggregate; below it the round keeps the old server state",
    )
    connect_timeout: float = Field(300.0, gt=0, description="seconds to wait for min_nodes to connect")
    cpus_per_client: float = Field(1.0, gt=0, description="flower-sim: Ray CPUs per virtual client")
    ray_address: str | None = Field(
        None, description="flower-sim: an existing Ray cluster to run the virtual clients on (host:port, or auto: "
        "the one running on this machine); null: start a Ray instance of this machine's cores"
    )
    secagg: SecAggConfig = SecAggConfig()


class PrivacyConfig(Strict):
    """Central differential privacy with client-side fixed clipping (DP-FedAvg, McMahan et al. 2018)."""

    dp: Literal["none", "central"] = "none"
    clipping_norm: float = Field(1.0, gt=0, description="L2 bound C of each client's update")
    prototype_clipping_norm: float = Field(
        1.0, gt=0, description="methods that send class prototypes (protohar): the L2 bound of a client's prototypes "
        "(its [classes, k] matrix); the noise on their sum has std z times it")
    noise_multiplier: float = Field(
        1.0, ge=0, description="z: the server adds N(0, (z C / m)^2) to the mean of m updates; with target_epsilon, "
        "the smallest z that meets it instead")
    target_epsilon: float | None = Field(
        None, gt=0, description="a budget: z is chosen so that the whole run is (target_epsilon, delta)-DP for each "
        "client (fedwear.privacy.noise_for_budget); null: z is noise_multiplier")
    delta: float = Field(1e-5, gt=0, lt=1, description="the delta of the (epsilon, delta) the run reports; keep it "
                         "well below 1 / (training clients)")

    @model_validator(mode="after")
    def _one_noise_setting(self) -> PrivacyConfig:
        if self.target_epsilon is not None and self.noise_multiplier != 1.0:
            raise ValueError("set privacy.noise_multiplier or privacy.target_epsilon, not both: a budget chooses "
                             "the noise multiplier")
        return self


class RobustConfig(Strict):
    """Aggregation that one poisoned client among several cannot take over, for methods whose
    server averages client arrays (``fedwear.engines.robust``)."""

    rule: Literal["mean", "median", "trimmed_mean"] = Field(
        "mean", description="each coordinate's weighted mean (the method's own rule), median (Flower's FedMedian; "
        "Yin et al. 2018) or trimmed mean (Flower's FedTrimmedAvg), both unweighted as Flower's are"
    )
    trim: float = Field(0.2, ge=0, lt=0.5, description="trimmed_mean: the fraction of replies cut from each end of "
                        "every coordinate (Flower's FedTrimmedAvg beta, default 0.2)")
    norm_bound: float | None = Field(
        None, gt=0, description="L2 bound on each reply's update (reply minus the global model, over all its float "
        "arrays), applied by the server before aggregating: a longer update is scaled down to it "
        "(Sun et al. 2019, norm bounding); null: no bound"
    )


class TrackingConfig(Strict):
    """Experiment trackers the run also logs to (:mod:`fedwear.tracking`); ``tracking: [mlflow]``
    is short for ``tracking: {backends: [mlflow]}``. They do not change the numbers, so they stay
    out of the config hash."""

    backends: list[Literal["mlflow", "tensorboard"]] = Field(
        default_factory=list, description="mlflow (a run in an MLflow store), tensorboard (event files in the "
        "run directory's tensorboard/); empty: none"
    )
    mlflow_uri: str | None = Field(
        None, description="MLflow tracking URI; null: $MLFLOW_TRACKING_URI, else MLflow's own default "
        "(sqlite:///mlflow.db in the working directory, which `mlflow ui` opens)"
    )
    experiment: str = Field("fedwear", min_length=1, description="the MLflow experiment the run is logged under")

    @model_validator(mode="before")
    @classmethod
    def _a_bare_list(cls, v: Any) -> Any:
        return {"backends": v} if isinstance(v, (list, tuple, str)) else v

    @field_validator("backends", mode="before")
    @classmethod
    def _one_name(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v


class RunConfig(Strict):
    method: str = "fedavg"
    rounds: int = Field(20, ge=1, le=100_000, description="every round's clients are drawn up front, so a run "
                        "holds its whole schedule: at most 100,000 (the papers run 100 to 1,000)")
    clients_per_round: int | float = Field(1.0, description="a count (int) or a fraction of clients (float in (0, 1])")
    local_epochs: int = Field(1, ge=0)
    batch_size: int = Field(32, ge=1)
    grad_clip: float | None = Field(None, gt=0)
    seed: int = Field(0, ge=0, le=SEED_MAX, description="the run seed: every random draw derives from it")
    engine: Literal["sim", "batched", "flower-sim", "flower"] = Field(
        "sim", description="sim (in-process, client by client); batched (in-process, a round's clients trained "
        "together where the method and model allow it, else as sim); flower-sim (Flower simulation, Ray); "
        "flower = a deployment (fedwear flower serve)"
    )
    client_states: Literal["memory", "disk"] = Field(
        "memory", description="where the in-process engines keep client states between rounds: memory, or disk "
        "(files in the run directory; memory bounded by a round's clients)"
    )
    threads: int | None = Field(None, ge=1, description="torch threads; null: 1 when a training batch is under "
                                "1 GFLOP (engines/process.py::choose_threads), else torch's default (every core)")
    drop_last: bool = Field(
        False, description="skip each epoch's last partial batch (Meta-HAR's and FedMAT's loaders: Chain123/Meta-HAR met-har.py, Super-Shen/FedMAT iLog_train.py); "
        "a client with fewer train windows than one batch then trains no step"
    )
    device: Literal["cpu", "cuda", "auto"] = Field(
        "cpu",
        description="where models train and evaluate: cpu, cuda (a GPU; refused when torch sees none) or auto "
        "(cuda when available and the method declares it, else cpu). cuda runs for methods that declare it "
        "(`fedwear methods` marks them); results "
        "on a GPU match the CPU's only up to float rounding",
    )
    precision: Literal["fp32", "tf32", "bf16"] = Field(
        "fp32",
        description="float precision of training and evaluation: fp32 (exact; on a GPU TF32 is turned off), tf32 "
        "(a GPU's TF32 matmuls and convolutions) or bf16 (autocast of forward passes; engine=batched then trains "
        "client by client)",
    )
    compile: bool | Literal["reduce-overhead"] = Field(
        False, description="torch.compile the model's body and head (fewer kernel launches; clients then train one "
        "by one); reduce-overhead: torch.compile's mode that replays CUDA graphs on a GPU (one launch for a "
        "step's kernels; a graph per batch shape). Numbers agree with an uncompiled run up to float rounding; on "
        "the CPUs measured it is slower (docs/performance.md, \"bf16 and torch.compile on the CPU\")",
    )
    deterministic: bool = Field(
        False, description="torch's deterministic algorithms (and CUBLAS_WORKSPACE_CONFIG on a GPU): the same "
        "numbers on every run of a GPU, at some speed; the CPU's are deterministic either way"
    )
    checkpoint_every: int = Field(1, ge=0, description="save a checkpoint every N rounds (0: never)")
    dataset: DatasetConfig = DatasetConfig()
    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    flower: FlowerConfig = FlowerConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    robust: RobustConfig = RobustConfig()
    tracking: TrackingConfig = TrackingConfig()
    method_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    per_method: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="method -> settings applied when that method runs (e.g. {protohar: {grad_clip: 50}}); "
        "--set wins over them. Applied on loading, so a run's config.yaml holds the result",
    )

    @field_validator("clients_per_round")
    @classmethod
    def _check_cpr(cls, v: int | float) -> int | float:
        if isinstance(v, float) and not 0 < v <= 1:
            raise ValueError("a fraction must be in (0, 1]; use an int for a count")
        if isinstance(v, int) and v < 1:
            raise ValueError("a count must be >= 1")
        return v

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_mode(cls, v: object) -> object:
        if isinstance(v, bool):
            return v
        words = {"true": True, "false": False, "reduce-overhead": "reduce-overhead"}
        if isinstance(v, str) and v.lower() in words:
            return words[v.lower()]
        raise ValueError(f"{v!r}: use true, false or reduce-overhead")

    def clients_per_round_count(self, n: int) -> int:
        """How many of the ``n`` training clients train each round. A count above ``n`` is cut to
        ``n`` with a warning naming both numbers: the run is not the one the config describes."""
        v = self.clients_per_round
        if isinstance(v, float):
            return max(1, min(n, -(-round(v * n * 1e9) // 10**9)))  # ceil, robust to 0.15 * 20
        if v > n:
            logging.getLogger("fedwear").warning(
                "clients_per_round=%d, but there are only %d training clients: every round trains all %d", v, n, n)
        return min(n, v)

    def settings(self) -> dict[str, Any]:
        """The settings that decide a run's numbers and differ from the defaults, as a tree: a
        key added later (with a default) does not orphan run directories made before it; where
        the data lives (``dataset.root``, ``dataset.sources[].root``, ``dataset.cache_dir``),
        how many threads run it (``threads``), where else its numbers are logged (``tracking``,
        ``flower.ray_address``) and other methods' options do not count."""
        tree = self.model_dump(mode="json", exclude_defaults=True)
        dataset = tree.pop("dataset", {})
        dataset = {k: v for k, v in dataset.items() if k not in ("root", "cache_dir")}
        if "sources" in dataset:  # a merged dataset's sources: where their files live does not count either
            dataset["sources"] = [{k: v for k, v in src.items() if k != "root"} for src in dataset["sources"]]
        if dataset:
            tree["dataset"] = dataset
        tree.pop("threads", None)  # an execution setting: summary.json's versions records it
        tree.pop("tracking", None)  # where the numbers are also logged, not what they are
        if "ray_address" in tree.get("flower", {}):  # where the clients run, not what they compute
            tree["flower"].pop("ray_address")
            if not tree["flower"]:
                tree.pop("flower")
        own = self.method_options.get(self.method)
        tree.pop("method_options", None)
        if own:
            tree["method_options"] = {self.method: own}
        return tree

    def hash(self) -> str:
        """Digest of :meth:`settings`: two configs with the same hash make the same numbers."""
        return hashlib.sha256(json.dumps(self.settings(), sort_keys=True).encode()).hexdigest()[:16]


def flat_params(tree: dict, prefix: str = "") -> dict[str, str]:
    """A nested config tree as dotted keys and text values (JSON for all but strings): MLflow's
    params, and what ``fedwear report`` compares between seeds."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = json.dumps(value) if not isinstance(value, str) else value
    return out


def _set_path(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {k!r} is not a section")
    node[keys[-1]] = value


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    out = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set rounds=10")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError:
            value = raw
        out.append((key.strip(), value))
    return out


def _describe(err: dict, source: str) -> str:
    key = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        parent: type[BaseModel] = RunConfig
        for p in err["loc"][:-1]:
            field = parent.model_fields.get(str(p))
            if field is None:  # a list index (dataset.sources.0) or a dict key
                continue
            parent = _model_in(field.annotation) or parent
        prefix = "".join(f"{p}." for p in err["loc"][:-1])
        hint = did_you_mean(str(err["loc"][-1]), parent.model_fields, prefix)
        return f"{source}: unknown key {key!r}; {hint}allowed keys here: {', '.join(parent.model_fields)}"
    return f"{source}: key {key!r}: {err['msg']} (got {err.get('input')!r})"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``Model``, ``list[Model]``, ``Model | None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


_LEADING_KEY = re.compile(r"^(?:key ')?([A-Za-z_][\w.]*)")


def _source_of(loc: tuple, overrides: list[tuple[str, Any]], path: str | Path | None) -> str:
    """Who set the offending key: the ``--set`` item that covers it, else the file (or 'config')."""
    key = ".".join(str(p) for p in loc)
    for k, v in reversed(overrides):
        if key == k or key.startswith(k + ".") or k.startswith(key + "."):
            return f"--set {k}={v}"
    return str(path) if path else "config"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, data: dict | None = None) -> RunConfig:
    """Load a YAML config (or a dict), apply ``key=value`` overrides, validate.

    Every mistake is a one-line :class:`ConfigError` naming the key and where it was set.
    """
    source = str(path) if path else "config"
    tree: dict = dict(data or {})
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: config file not found; pass a YAML file such as configs/quickstart.yaml")
        try:
            tree = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of keys")
    sets = parse_overrides(overrides or [])
    for key, value in sets:
        _set_path(tree, key, value)
    _apply_per_method(tree, {k for k, _ in sets}, source)
    try:
        cfg = RunConfig.model_validate(tree)
    except ValidationError as e:
        err = e.errors()[0]
        raise ConfigError(_describe(err, _source_of(err["loc"], sets, path))) from None
    if "best_metric" not in cfg.evaluation.model_fields_set:
        try:
            cfg.evaluation.best_metric = f"personalized.{KIND_METRICS[task_kind(cfg)][0]}"
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
    try:
        check_consistency(cfg)
    except ConfigError as e:  # its message starts with the key at fault: blame the --set that set it
        key = _LEADING_KEY.match(str(e))
        raise ConfigError(f"{_source_of(tuple(key.group(1).split('.')) if key else (), sets, path)}: {e}") from None
    return cfg


def _apply_per_method(tree: dict, explicit: set[str], source: str) -> None:
    """Merge ``per_method[<method>]`` into ``tree`` (keys given with ``--set`` win), then clear it."""
    table = tree.get("per_method") or {}
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: key 'per_method' must map method names to settings")
    method = tree.get("method", RunConfig.model_fields["method"].default)
    if not isinstance(method, str):  # validation names the bad 'method' key
        return
    chosen = table.get(method) or {}
    if not isinstance(chosen, dict):
        raise ConfigError(f"{source}: key 'per_method.{tree.get('method')}' must be a mapping of settings")

    def merge(node: dict, extra: dict, prefix: str) -> None:
        for k, v in extra.items():
            dotted = f"{prefix}{k}"
            if dotted in explicit:
                continue
            if isinstance(v, dict) and isinstance(node.get(k), dict):
                merge(node[k], v, dotted + ".")
            else:
                node[k] = v

    merge(tree, chosen, "")
    tree["per_method"] = {}


def task_kind(cfg: RunConfig) -> str:
    """The task kind of the configured dataset: classification or regression."""
    from fedwear.data import dataset_kind

    return dataset_kind(cfg.dataset.name)


def check_consistency(cfg: RunConfig) -> None:
    """Checks across keys: method and model options, best_metric, the method for the task,
    privacy for the method."""
    for name in {cfg.method, *cfg.method_options}:
        parse_options(name, cfg.method_options.get(name))
    parse_model_options(cfg.model.name, cfg.model.options)
    kind = task_kind(cfg)
    metrics = KIND_METRICS[kind]
    if kind not in method_class(cfg.method).kinds:
        able = sorted(n for n, c in METHODS.items() if kind in c.kinds)
        raise ConfigError(
            f"method={cfg.method} does not handle {kind} (dataset {cfg.dataset.name}); methods that do: "
            f"{', '.join(able)}"
        )
    budgets = method_class(cfg.method).budgets

    def known(view: str) -> bool:  # a view, or a view of one of the method's fine-tuning budgets
        base, _, budget = view.partition("@")
        return base in VIEWS and (not budget or budget in budgets)

    if cfg.dataset.normalize == "fixed" and kind == "classification":
        raise ConfigError(f"dataset.normalize=fixed divides forecasting targets by dataset.scale; dataset "
                          f"{cfg.dataset.name} is a classification dataset: use client, global, group or none")
    view, _, metric = cfg.evaluation.best_metric.partition(".")
    if not known(view) or metric not in metrics:
        raise ConfigError(
            f"key 'evaluation.best_metric': {cfg.evaluation.best_metric!r} is not view.metric "
            f"(views {', '.join(VIEWS)}; metrics of {kind}: {', '.join(metrics)})"
        )
    if cfg.evaluation.best_split == "val" and cfg.dataset.val_fraction == 0:
        raise ConfigError("evaluation.best_split=val needs dataset.val_fraction > 0")
    for target in cfg.evaluation.targets:
        tv, _, tm = target.partition(".")
        if not known(tv) or tm not in metrics:
            raise ConfigError(f"key 'evaluation.targets': {target!r} is not view.metric")
    for view, rule in cfg.evaluation.best_for.items():
        rv, _, rm = rule.partition(".")
        if not known(view) or not known(rv) or rm not in metrics:
            raise ConfigError(
                f"key 'evaluation.best_for': {view}: {rule} must map a view to view.metric "
                f"(views {', '.join(VIEWS)}; metrics {', '.join(metrics)})"
            )
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device=cuda: torch sees no CUDA device here (torch.cuda.is_available() is False); "
                              "set device=cpu or device=auto")
        able = method_class(cfg.method).devices
        if "cuda" not in able:
            raise ConfigError(f"device=cuda: method={cfg.method} runs on the CPU only (its own tensors are not "
                              f"placed on a device); set device=cpu")
    if cfg.compile and cfg.device != "cuda" and not any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "c++")):
        raise ConfigError("compile: true on the CPU needs a C++ compiler for torch.compile's kernels and none is on "
                          "PATH (g++, c++ or $CXX): install one (Debian: apt-get install g++) or set compile: false")
    if cfg.privacy.dp != "none" and not method_class(cfg.method).private():
        able = sorted(n for n, c in METHODS.items() if c.private())
        raise ConfigError(f"privacy.dp: method={cfg.method} cannot run with central DP: "
                          f"{method_class(cfg.method).no_dp_reason} (methods that can: {', '.join(able)})")
    if cfg.flower.secagg.enabled:
        _check_secure_aggregation(cfg)
    robust = cfg.robust.rule != "mean" or cfg.robust.norm_bound is not None
    if robust and not method_class(cfg.method).mean_aggregation:
        means = sorted(n for n, c in METHODS.items() if c.mean_aggregation)
        raise ConfigError(f"robust: method={cfg.method} does not aggregate by one mean of client arrays; robust "
                          f"aggregation applies to {', '.join(means)}")
    if robust and cfg.flower.secagg.enabled:
        raise ConfigError("robust and flower.secagg.enabled: under secure aggregation the server sees only the sum "
                          "of the replies, so it can neither bound nor rank them; use one or the other")
    if cfg.robust.rule != "mean" and cfg.privacy.dp != "none":
        raise ConfigError(f"robust.rule={cfg.robust.rule} with privacy.dp: the noise is calibrated for a mean of "
                          "clipped updates; keep robust.rule=mean (robust.norm_bound composes with DP)")
    if cfg.flower.secagg.enabled and cfg.engine in ("sim", "batched"):
        raise ConfigError("flower.secagg.enabled needs engine=flower-sim or a Flower deployment")
    if cfg.client_states == "disk" and cfg.engine in ("flower-sim", "flower"):
        raise ConfigError(f"client_states=disk needs engine=sim or batched (engine={cfg.engine} keeps client "
                          "states in Flower's Context): remove client_states or set engine=sim")


def _check_secure_aggregation(cfg: RunConfig) -> None:
    """SecAgg+ hands the server one mean: enough for a method whose server averages client arrays,
    and under central DP for every private method (its clipped replies all weigh 1, and a mean
    step or the sums of its parts follow from their mean: ``privacy.py``)."""
    method, secagg = method_class(cfg.method), cfg.flower.secagg
    dp = cfg.privacy.dp == "central"
    if not (method.mean_aggregation or (dp and method.private())):
        means = sorted(n for n, c in METHODS.items() if c.mean_aggregation)
        private = sorted(n for n, c in METHODS.items() if c.private() and not c.mean_aggregation)
        raise ConfigError(f"flower.secagg.enabled needs a method whose server averages client arrays "
                          f"({', '.join(means)}), or privacy.dp: central with {', '.join(private)}; "
                          f"method={cfg.method} is neither")
    bound = max(cfg.privacy.clipping_norm, cfg.privacy.prototype_clipping_norm if method.dp_part_count else 0.0)
    if dp and secagg.clipping_range < bound:
        raise ConfigError(f"flower.secagg.clipping_range={secagg.clipping_range:g} is below the DP clipping bound "
                          f"{bound:g} (privacy.clipping_norm / prototype_clipping_norm): SecAgg+ would cut clipped "
                          f"entries; set flower.secagg.clipping_range to at least {bound:g}")


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
