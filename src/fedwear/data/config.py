"""Dataset and preprocessing configuration (the ``dataset:`` block of a run config)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
    model_validator,
)

from fedwear.errors import did_you_mean
from fedwear.seeding import SEED_MAX


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SyntheticConfig(Strict):
    """Synthetic data for fast tests (``dataset.name: synthetic`` or ``synthetic_hr``)."""

    num_subjects: int = Field(8, ge=2)
    num_classes: int = Field(4, ge=2)
    channels: int = Field(3, ge=1)
    rate_hz: float = Field(50.0, gt=0)
    seconds_per_class: float = Field(
        20.0, gt=0, description="recording length per subject and class"
    )
    subject_shift: float = Field(
        0.5, ge=0, description="std of each subject's per-channel offset and gain change"
    )
    noise: float = Field(0.3, ge=0)
    series_length: int = Field(900, ge=10, description="synthetic_hr: values (seconds) per subject")


class HeartRateConfig(Strict):
    """Cleaning of the heart-rate datasets (README sections 3-5; pcfedh/pcfedh get_data_ppg.py, get_data_multi.py)."""

    drives: list[int] = Field(
        [3, 4, 5, 6, 7], min_length=1,
        description="distracted_driving: the drives kept (PCFedH keeps 3-7, drops 1, 2 and 8)",
    )
    zeros: Literal["remove", "drop_windows"] = Field(
        "remove",
        description="distracted_driving: zero heart rate (sensor dropout) is removed from the series "
        "(the paper) or every window holding one is dropped (PCFedH's code)",
    )


class ForecastConfig(Strict):
    """Next-value forecasting windows (regression datasets; PCFedH, pcfedh/pcfedh)."""

    skip_last: bool = Field(
        False,
        description="leave out each series' last window, as PCFedH's distracted-driving loader does "
        "(range(len - 151))",
    )
    train_multiple: int = Field(
        1, ge=1,
        description="keep the first multiple of this of each series' train windows (PCFedH's "
        "PPG-DaLiA code: 10); the dropped ones are not used",
    )


class SourceConfig(Strict):
    """One dataset merged into a ``merged`` federation (``dataset.sources``; Meta-HAR's merged
    HHAR + USC-HAD set, its Sec. 4.1): loaded by its own module, relabelled, resampled, tagged."""

    name: str = Field(description="the source's dataset module, e.g. usc_had, uci_hapt")
    tag: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.]+$",
        description="prefix of its subjects and value of the recordings' meta key source; null = "
        "name (set it when one dataset is merged twice)",
    )
    root: str | None = Field(
        None,
        description="folder holding the source's original files; null = <dataset.root>/<name> when "
        "dataset.root is set, else its bundled subset (where fedwear ships one)",
    )
    rate_hz: float | None = Field(
        None, gt=0,
        description="resample this source to this rate; null = dataset.rate_hz (Meta-HAR: HHAR "
        "at 25 Hz beside USC-HAD at 50 Hz, both in 150-sample windows)",
    )
    classes: dict[int | str, str] = Field(
        {},
        description="source class (name as the loader names it, or 0-based index) -> unified "
        "class name; several may map to one name; classes left out are dropped; {} keeps every "
        "class under its own name",
    )
    synthetic: SyntheticConfig | None = Field(
        None, description="a synthetic source's generator settings; null = dataset.synthetic"
    )

    @property
    def label(self) -> str:
        """The source's tag: ``tag``, else its dataset name."""
        return self.tag or self.name


class DatasetConfig(Strict):
    name: str = Field(
        "synthetic",
        description="dataset module: synthetic, uci_hapt, usc_had (activity classification); "
        "merged (several of them in one federation, dataset.sources); "
        "ppg_dalia_hr, distracted_driving, stress_predict_hr (heart-rate forecasting)",
    )
    root: str | None = Field(
        None, description="folder holding the dataset's original files (name=merged: the folder holding "
        "each source's folder under its dataset name, for sources without a root of their own)",
    )
    seed: int | None = Field(
        None, ge=0, le=SEED_MAX, description="seed for splits and partitions; null = the run seed"
    )
    cache_dir: str | None = Field(
        "user",
        description="processed-data cache folder; 'user': the user's cache directory "
        "(platformdirs, e.g. ~/.cache/fedwear on Linux); null disables",
    )

    # preprocessing
    channels: list[str] | None = Field(None, description="channel names to keep (default: all)")
    classes: list[int] | None = Field(
        None, description="class indices to keep (default: all), 0-based"
    )
    rate_hz: float | None = Field(
        None, gt=0, description="resample to this rate (anti-aliased); null keeps the native rate"
    )
    window: int = Field(
        128, ge=4,
        description="window length in samples at the processed rate (forecasting: the past values "
        "seen, PCFedH: 150)",
    )
    stride: int | None = Field(
        None, ge=1, description="window stride; null = window (no overlap), 1 for forecasting"
    )
    tail_window: bool = Field(
        False,
        description="also cut the trailing window x[-window:] of each labelled run when the "
        "regular windows miss its end (ProtoHAR's USC-HAD script); it overlaps the previous window",
    )
    normalize: Literal["none", "client", "global", "group", "fixed"] = Field(
        "client",
        description="per-channel z-score with statistics of training data only: each client's own "
        "train split (client) or all training clients' train splits pooled (global); group: one "
        "mean/std per sensor (channels named <sensor>_<axis>: acc_x..acc_z share one, gyro_* "
        "another) per group of recordings sharing dataset.normalize_group, from the training "
        "clients' train windows of that group (FedAli: per phone model, getalp/FedAli Data_HHAR_FL.py); fixed: divide "
        "by dataset.scale. Forecasting targets are scaled with the inputs (client, group: not "
        "available) and predictions are mapped back for the metrics",
    )
    normalize_group: list[str] = Field(
        [],
        description="normalize=group: the recording keys (subject, session or metadata such as "
        "device, position, source) whose values form one statistics group, e.g. [device] for "
        "FedAli's per-phone-model statistics on HHAR; [] = one group, the whole dataset",
    )
    normalize_from: Literal["train", "all_leaky"] = Field(
        "train",
        description="the windows normalize=client|global|group takes its statistics from: train "
        "(the train splits, as above); all_leaky: every window (train, val and test) of the "
        "client, of all clients (held-out ones included) or of the group, as FedAli's code "
        "computes them before its split (Data_HHAR_FL.py); test statistics then leak into training",
    )
    scale: float = Field(
        100.0, gt=0, description="normalize=fixed: the divisor (PCFedH divides heart rate by 100)"
    )

    # per-client split
    split: Literal["time", "stratified", "fewshot", "kfold"] = Field(
        "time",
        description="time: time-ordered per class with a one-window gap (forecasting: per series, "
        "the first windows train, the last test_fraction test); stratified: random stratified (the "
        "papers' way); fewshot: ProtoHAR's per-class cap (DataSplitting.py); kfold: FedAli's split "
        "(processFLData.py), scikit-learn StratifiedKFold(dataset.folds, shuffle=False) on the client's "
        "windows in recording order, the last round(test_fraction * folds) folds test (10 folds "
        "and 0.3: folds 7-9), i.e. about the last test_fraction of each class; val is the last "
        "val_fraction of each class's train windows. FedAli does not purge: set purge=false",
    )
    test_fraction: float = Field(0.3, gt=0, lt=1)
    folds: int = Field(
        10, ge=2,
        description="split=kfold: number of StratifiedKFold folds (FedAli: 10); a client with "
        "fewer windows than folds, or whose every class has fewer, gets no train side and is "
        "dropped",
    )
    val_fraction: float = Field(0.0, ge=0, lt=1, description="taken from the train side")
    shots: int = Field(20, ge=1, description="fewshot split: training windows per class cap")
    purge: bool = Field(
        True,
        description="drop val/test windows that overlap a train window of the same recording; "
        "false keeps them, as ProtoHAR's code does with its overlapping trailing windows (leaky)",
    )

    # partition
    partition: Literal["natural", "dirichlet"] = Field(
        "natural",
        description="natural: one client per distinct value of dataset.client_by (default: per "
        "subject); dirichlet: per-class Dirichlet shares over dataset.num_clients clients",
    )
    client_by: list[str] = Field(
        ["subject"],
        min_length=1,
        description="partition=natural: the recording keys whose combination is one client: "
        "subject, session or metadata a loader sets (device, position, source), e.g. "
        "[subject, device] for HHAR, [subject, position] for RealWorld (FedAli's Datasets/*_FL.py). Client ids join "
        "the values in this order with '-' (subject as s01: s01, s01-nexus4); a value a recording "
        "lacks is left out; clients are sorted by the values (numbers numerically)",
    )
    dirichlet_alpha: float = Field(0.5, gt=0)
    num_clients: int | None = Field(
        None, ge=2, description="dirichlet: number of clients (default: number of subjects)"
    )
    drop_classes: int | list[int] = Field(
        0,
        description="label skew: classes removed from each client at random, always keeping at "
        "least one: k (exactly k each, ProtoHAR) or a range [lo, hi] (a number drawn uniformly "
        "in lo..hi per client; Meta-HAR removes 0 to 2: [0, 2], its Sec. 4.1)",
    )
    min_windows: int = Field(2, ge=1, description="clients with fewer train windows are dropped")
    held_out: int | list[str] = Field(
        0, description="number (drawn from the seed) or ids of clients that never train"
    )
    held_out_per: str | None = Field(
        None,
        description="draw held_out clients within each value of this recording meta key (source: "
        "one per source of a merged dataset, Meta-HAR's two meta-test users, its Sec. 4.2); null: "
        "from all clients",
    )
    max_clients: int | None = Field(
        None, ge=1, description="keep only the first N clients (quick tests)"
    )

    sources: list[SourceConfig] = Field(
        [],
        description="name=merged: the datasets merged into one federation, each relabelled into "
        "the unified class list (the mapped names in order of first appearance) and resampled to "
        "dataset.rate_hz (required) or its own rate_hz; subjects become <tag>-s01 and every "
        "recording carries meta source=<tag> (Meta-HAR's merged set, its Sec. 4.1)",
    )

    synthetic: SyntheticConfig = SyntheticConfig()
    heart_rate: HeartRateConfig = HeartRateConfig()
    forecast: ForecastConfig = ForecastConfig()

    # loaders
    faithful: bool = Field(
        False,
        description="read the data with the seed papers' alignment quirks (FedAli's Data_HHAR_FL.py, Data_RealWorld_FL.py): HHAR's gyro "
        "taken at the acc rows' indices of Phones_gyroscope.csv and FedAli's run-length filter, "
        "RealWorld's gyro replaced by resampled acc when acc is over 100 samples longer and its "
        "length-based pairing; false: acc and gyro aligned on their timestamps (docs/datasets.md)",
    )
    schema_file: str | None = Field(
        None,
        description="dataset.name=own: the YAML schema describing the folder (rate, channels, "
        "label column or per-file labels, units; docs/own-data.md); null = <root>/schema.yaml",
    )
    preset: str | None = Field(
        None,
        description="a seed paper's preprocessing of this dataset as named defaults (keys set in "
        "the config win): protohar (pamap2, unimib_shar, harbox), fedali (hhar, realworld); the "
        "keys each sets are listed in docs/datasets.md",
    )

    @field_validator("drop_classes")
    @classmethod
    def _drop_range(cls, v: int | list[int]) -> int | list[int]:
        """A count >= 0 or a range [lo, hi] with 0 <= lo <= hi."""
        if isinstance(v, int) and v < 0:
            raise ValueError("a count of classes must be >= 0")
        if not isinstance(v, int) and (len(v) != 2 or not 0 <= v[0] <= v[1]):
            raise ValueError("give a count k or a range [lo, hi] with 0 <= lo <= hi, e.g. [0, 2]")
        return v

    @field_validator("sources", mode="before")
    @classmethod
    def _source_keys(cls, v: Any) -> Any:
        """Unknown keys of a source (and of its ``synthetic`` block) are named here, in one line,
        rather than by pydantic's error inside a list."""
        for i, item in enumerate(v if isinstance(v, list) else []):
            if not isinstance(item, dict):
                continue
            blocks = [(f"sources[{i}]", item, SourceConfig)]
            if isinstance(item.get("synthetic"), dict):
                blocks.append((f"sources[{i}].synthetic", item["synthetic"], SyntheticConfig))
            for where, tree, model in blocks:
                extra = sorted(set(tree) - set(model.model_fields), key=str)
                if extra:
                    raise ValueError(
                        f"{where}: unknown key {extra[0]!r}; {did_you_mean(str(extra[0]), model.model_fields)}"
                        f"allowed: {', '.join(model.model_fields)}"
                    )
        return v

    @field_validator("sources")
    @classmethod
    def _distinct_tags(cls, v: list[SourceConfig]) -> list[SourceConfig]:
        """Every source has its own tag (two sources of one dataset need ``tag``)."""
        tags = [s.label for s in v]
        dup = sorted({t for t in tags if tags.count(t) > 1})
        if dup:
            raise ValueError(f"two sources are tagged {dup[0]!r}: give each its own tag")
        return v

    @model_validator(mode="after")
    def _held_out_per_and_sources(self) -> DatasetConfig:
        """``held_out_per`` draws a number of clients; ``sources`` is read by ``merged`` only."""
        if self.held_out_per is not None and not isinstance(self.held_out, int):
            raise ValueError("dataset.held_out_per draws a number of clients per group: set held_out to a "
                             "number, or held_out_per: null to list client ids")
        if self.sources and self.name != "merged":
            raise ValueError(
                f"dataset.sources is read only by dataset.name=merged (got {self.name!r}): set "
                "name: merged or remove sources"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """``preset``: fill in the preset's keys that the config does not set (PRESETS)."""
        if not isinstance(data, dict) or data.get("preset") is None:
            return data
        name, preset = data.get("name", "synthetic"), data["preset"]
        known = PRESETS.get(name, {})
        if preset not in known:
            have = ", ".join(f"{p} ({d})" for d, ps in PRESETS.items() for p in ps)
            raise ValueError(
                f"dataset.preset={preset!r} is not a preset of dataset {name!r}; presets: {have}"
            )
        return {**known[preset], **data}

    @model_serializer(mode="wrap")
    def _omit_quiet_defaults(self, handler: Any) -> dict[str, Any]:
        """Leave the loader keys (``QUIET_DEFAULTS``) out of a dump while they hold their
        default, so cache keys and resolved configs of existing runs stay as they were."""
        out = handler(self)
        return {k: v for k, v in out.items() if k not in QUIET_DEFAULTS or v != QUIET_DEFAULTS[k]}

    @field_validator("client_by", "normalize_group")
    @classmethod
    def _distinct_keys(cls, keys: list[str]) -> list[str]:
        """Recording keys are non-empty and listed once each."""
        if any(not k for k in keys) or len(set(keys)) != len(keys):
            raise ValueError("list each recording key once, e.g. [subject, device]")
        return keys


#: Loader keys left out of a dump at their default (:meth:`DatasetConfig._omit_quiet_defaults`).
QUIET_DEFAULTS: dict[str, object] = {
    "faithful": False, "schema_file": None, "preset": None, "sources": [], "held_out_per": None,
}

_PROTOHAR = {  # cheng-haha/ProtoHAR's data scripts and runexp.sh: no normalisation, "20k2p" few-shot clients
    "normalize": "none", "split": "fewshot", "shots": 20, "drop_classes": 2, "purge": False,
}
_FEDALI = {  # getalp/FedAli Datasets/*_FL.py, processFLData.py: 128 samples at 50 Hz, 50% overlap, StratifiedKFold 7/3 without purge
    "window": 128, "stride": 64, "split": "kfold", "folds": 10, "test_fraction": 0.3,
    "purge": False, "normalize": "group", "normalize_group": ["device"],
    "normalize_from": "all_leaky",
}

#: dataset -> preset -> the ``dataset:`` keys it sets (docs/datasets.md lists them).
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "pamap2": {"protohar": {  # 100 Hz / 3, 171 samples, the 12 protocol activities (A2)
        **_PROTOHAR, "rate_hz": 100.0 / 3, "window": 171, "stride": 171,
        "classes": [0, 1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 17],
    }},
    "unimib_shar": {"protohar": {**_PROTOHAR, "window": 151, "stride": 151}},  # the shipped windows
    "harbox": {"protohar": {**_PROTOHAR, "window": 100, "stride": 100}},  # 100 x 9 per sample
    "hhar": {"fedali": {  # client = user x phone model, statistics per phone model
        **_FEDALI, "rate_hz": 50.0, "client_by": ["subject", "device"],
    }},
    "realworld": {"fedali": {  # client = subject x position, statistics phones / watch
        **_FEDALI, "client_by": ["subject", "position"],
    }},
}
