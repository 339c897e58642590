"""The figures of a regression (heart-rate forecasting) run, in the shape of PCFedH's paper
(Yin et al., FITEE 2025): predicted vs true heart rate of one client over time (Fig. 4,
:mod:`fedwear.report.forecast`) and, for runs with PCFedH's encoder and prototypes, the t-SNE
of the encoder features coloured by nearest prototype (Fig. 3, :mod:`fedwear.report.prototypes`).

Per method, the run with the lowest seed (as the per-client figures): its checkpoint, config and
data are read once (:func:`fedwear.report.embeddings.restore`) for both figures.
"""

from __future__ import annotations

from pathlib import Path

from fedwear.data import dataset_kind
from fedwear.errors import FedwearError
from fedwear.methods import METHODS
from fedwear.report.embeddings import Restored, Skipped, restore
from fedwear.report.forecast import client_forecast, forecast_plot
from fedwear.report.plots import Groups, Plot, colors
from fedwear.report.prototypes import TSNE_WINDOWS, encoder_features, prototype_plot
from fedwear.report.rundir import Run


def is_regression(run: Run) -> bool:
    """Whether ``run`` forecasts (its config's dataset is a regression dataset)."""
    name = (run.config.get("dataset") or {}).get("name")
    try:
        return isinstance(name, str) and dataset_kind(name) == "regression"
    except FedwearError:  # a dataset this fedwear does not know
        return False


def regression_runs(groups: Groups) -> dict[str, Run]:
    """Per variant (``Run.name``) whose lowest-seed run is a regression run: that run."""
    return {m: runs[0] for m, runs in groups.items() if runs and is_regression(runs[0])}


def _restore(run: Run, root: Path | None, cache: dict) -> Restored | Skipped:
    """:func:`restore`; without an explicit ``root``, a missing data folder skips the run (the
    figures come with every report) instead of failing the report."""
    try:
        return restore(run, root, cache)
    except FedwearError as e:
        if root is not None:
            raise
        return Skipped(run.name, run.seed, str(e))


def regression_plots(groups: Groups, out: Path, root: Path | None = None,
                     client: str | None = None, tsne_windows: int = TSNE_WINDOWS) -> list[Plot]:
    """For each variant's lowest-seed regression run: ``forecast-<name>-s<seed>.png`` (its
    client ``client``, default the first training client) and, when its server state has
    PCFedH's encoder and prototypes, ``prototypes-<name>-s<seed>.png`` (``tsne_windows``
    sampled train windows)."""
    plots: list[Plot] = []
    cache: dict = {}
    col = colors(groups)
    for method, run in regression_runs(groups).items():
        restored = _restore(run, root, cache)
        fc = client_forecast(restored, client) if isinstance(restored, Restored) else restored
        plots.append(forecast_plot(run, fc, out, col[method]))
        if isinstance(restored, Restored):
            features = encoder_features(restored, tsne_windows)
            if features is not None:
                plots.append(prototype_plot(run, features, out))
        elif getattr(METHODS.get(run.method), "has_cluster_space", False):  # it would have one: say why not
            plots.append(prototype_plot(run, restored, out))
    return plots
