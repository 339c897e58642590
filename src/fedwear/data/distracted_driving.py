"""The distracted-driving dataset's heart rate as a forecasting dataset (PCFedH, pcfedh/pcfedh get_data_multi.py).

Dataset: S. Taamneh et al., "A multimodal dataset for various forms of distracted driving",
Scientific Data 4:170110, 2017. One 1 Hz series per subject and drive (drives 3-7 by default,
``dataset.heart_rate.drives``); files, codes and cleaning in :mod:`fedwear.data.heart_rate`.
``dataset.heart_rate.zeros``: ``remove`` takes zero HR (sensor dropouts) out of the series as the
paper describes; ``drop_windows`` keeps them and drops every window that holds one, as PCFedH's
code does.
"""

from __future__ import annotations

from pathlib import Path

from fedwear.data import heart_rate
from fedwear.data.config import DatasetConfig
from fedwear.data.preprocess import require_root
from fedwear.data.types import RawDataset

NAME = "distracted_driving"
TITLE = "distracted driving (Taamneh et al. 2017)"
KIND = "regression"
DESCRIPTION = "Distracted driving: 68 drivers, heart rate (bpm) at 1 Hz in drives 3-7, next-value forecasting"
RATE_HZ = heart_rate.DISTRACTED_RATE_HZ
CHANNELS = ["hr"]
CLASS_NAMES: list[str] = []


def data_files(root: Path) -> list[Path]:
    return list(heart_rate.matching(root, heart_rate.DRIVING_CSV).values())


def load(cfg: DatasetConfig) -> RawDataset:
    hr = cfg.heart_rate
    series = heart_rate.read_distracted_driving(require_root(cfg, TITLE), hr.drives, hr.zeros == "remove")
    return heart_rate.as_raw(NAME, series)
