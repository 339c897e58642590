"""Every method of the heart-rate tables runs from its packaged config on the real datasets.

The table's own configs (``fedwear reproduce``'s plan) on the three heart-rate datasets, made
small: a few clients, every 20th window, one local epoch, three rounds (PCFedH: one clustering round,
the categorisation and the first soft-clustering round).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedwear
from fedwear import reproduce as rp

TABLES = {
    "pcfedh:table2-ppg_dalia": "ppg_dalia_hr",
    "pcfedh:table2-distracted_driving": "distracted_driving",
    "pcfedh:table2-stress_predict": "stress_predict",
    "pcfedh:table3": "ppg_dalia_hr",
    "pcfedh:table4": "ppg_dalia_hr",
}
SMALL = ["rounds=3", "local_epochs=1", "dataset.max_clients=5", "dataset.stride=20", "evaluation.every=1",
         "method_options.pcfedh.encoder_epochs=1",
         "method_options.pcfedh.pcl_rounds=1"]


@pytest.mark.slow
@pytest.mark.parametrize("key", list(TABLES))
def test_every_method_of_the_table_runs_on_the_real_data(key: str, data_root: Path, tmp_path: Path) -> None:
    exp = rp.experiment(key)
    runs = rp.plan(exp, tmp_path, root=str(data_root / TABLES[key]), seeds=[0], sets=SMALL)
    assert sorted(m for m, _, _ in runs) == sorted(exp.methods)
    for method, cfg, where in runs:
        assert cfg.rounds == 3, method
        res = fedwear.run(cfg, where, quiet=True)
        own = res.metrics[res.metrics["view"] == "personalized"]
        assert own["client"].nunique() == 5 and np.isfinite(own[["mse", "mae", "mape"]].to_numpy()).all(), method
        assert set(res.metrics["view"]) >= {"last_value", "client_mean"}, method  # the naive forecasts
        assert pd.read_csv(where / "timing.csv")["round"].max() == 3, method
