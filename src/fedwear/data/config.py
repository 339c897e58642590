"""Dataset and preprocessing configuration (the ``dataset:`` block of a run config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SyntheticConfig(Strict):
    """Synthetic HAR-like data for fast tests (``dataset.name: synthetic``)."""

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


class DatasetConfig(Strict):
    name: str = Field("synthetic", description="dataset module: synthetic, uci_hapt, usc_had")
    root: str | None = Field(None, description="folder holding the dataset's original files")
    seed: int | None = Field(
        None, description="seed for splits and partitions; null = the run seed"
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
    window: int = Field(128, ge=4, description="window length in samples at the processed rate")
    stride: int | None = Field(None, ge=1, description="window stride; null = window (no overlap)")
    tail_window: bool = Field(
        False,
        description="also cut the trailing window x[-window:] of each labelled run when the "
        "regular windows miss its end (ProtoHAR's USC-HAD script); it overlaps the previous window",
    )
    normalize: Literal["none", "client", "global"] = Field(
        "client",
        description="per-channel z-score with statistics of training data only: each client's own "
        "train split (client) or all training clients' train splits pooled (global)",
    )

    # per-client split
    split: Literal["time", "stratified", "fewshot"] = Field(
        "time",
        description="time: time-ordered per class with a one-window gap; stratified: random "
        "stratified (the papers' way); fewshot: ProtoHAR's per-class cap (SPECS A2)",
    )
    test_fraction: float = Field(0.3, gt=0, lt=1)
    val_fraction: float = Field(0.0, ge=0, lt=1, description="taken from the train side")
    shots: int = Field(20, ge=1, description="fewshot split: training windows per class cap")
    purge: bool = Field(
        True,
        description="drop val/test windows that overlap a train window of the same recording; "
        "false keeps them, as ProtoHAR's code does with its overlapping trailing windows (leaky)",
    )

    # partition
    partition: Literal["natural", "dirichlet"] = "natural"
    dirichlet_alpha: float = Field(0.5, gt=0)
    num_clients: int | None = Field(
        None, ge=2, description="dirichlet: number of clients (default: number of subjects)"
    )
    drop_classes: int = Field(0, ge=0, description="label skew: classes removed from each client")
    min_windows: int = Field(2, ge=1, description="clients with fewer train windows are dropped")
    held_out: int | list[str] = Field(
        0, description="number (drawn from the seed) or ids of clients that never train"
    )
    max_clients: int | None = Field(
        None, ge=1, description="keep only the first N clients (quick tests)"
    )

    synthetic: SyntheticConfig = SyntheticConfig()
