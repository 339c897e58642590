"""PPG-DaLiA heart rate as a forecasting dataset (PCFedH's first dataset, pcfedh/pcfedh get_data_ppg.py).

Dataset: A. Reiss, I. Indlekofer, P. Schmidt, K. Van Laerhoven, "Deep PPG: Large-Scale Heart
Rate Estimation with Convolutional Neural Networks", Sensors 19(14):3079, 2019 (CC BY 4.0 on the
UCI ML Repository). One 0.5 Hz series of ECG-derived heart rate per subject, 15 subjects; files
and quirks in :mod:`fedwear.data.heart_rate` (``S1.csv``.. or the original ``S1/S1.pkl``..).
"""

from __future__ import annotations

from pathlib import Path

from fedwear.data import heart_rate
from fedwear.data.config import DatasetConfig
from fedwear.data.preprocess import require_root
from fedwear.data.types import RawDataset

NAME = "ppg_dalia_hr"
TITLE = "PPG-DaLiA heart rate"
KIND = "regression"
DESCRIPTION = "PPG-DaLiA heart rate: 15 subjects, ECG-derived HR (bpm) every 2 s, next-value forecasting"
RATE_HZ = heart_rate.PPG_DALIA_RATE_HZ
CHANNELS = ["hr"]
CLASS_NAMES: list[str] = []


def data_files(root: Path) -> list[Path]:
    """``S*.csv[.gz]`` when present, else the original ``S*/S*.pkl[.gz]``."""
    csvs = list(heart_rate.matching(root, heart_rate.PPG_CSV).values())
    if csvs:
        return csvs
    return sorted((p for d in root.glob("S*") if d.is_dir()
                   for p in heart_rate.matching(d, heart_rate.PPG_PKL).values()),
                  key=lambda p: heart_rate.natural_key(p.parent.name))


def load(cfg: DatasetConfig) -> RawDataset:
    return heart_rate.as_raw(NAME, heart_rate.read_ppg_dalia(require_root(cfg, TITLE)))
