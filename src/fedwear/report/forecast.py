"""Predicted and true heart rate over time for one client (PCFedH, Yin et al., FITEE 2025,
Fig. 4: the predictions of PCFedH and FedProx against the ground truth of one client).

From a run's last checkpoint (:func:`fedwear.report.embeddings.restore`), the client's test
windows go, in their stored order (chronological within each recording), through the predictor
the run evaluated that client with in the personalized view at the checkpoint's round
(:func:`fedwear.report.embeddings.client_predictor`). The one model output per window and the
window's target are mapped back to bpm with the data's ``target = (shift, scale)``
(``value * scale + shift``), as the run's metrics are. A window's time is the time of its
target value: ``(start + window) / rate_hz`` seconds from the start of its recording's series
(``start`` is the window's first sample at the processed rate ``rate_hz``). One panel per
recording of the client's test windows (the paper's four panels are four consecutive driving
segments of one client).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fedwear.callbacks import CHECKPOINT
from fedwear.engines.client import forward
from fedwear.evaluation.metrics import regression_metrics
from fedwear.evaluation.predictor import as_predictor
from fedwear.report.embeddings import (
    Restored,
    Skipped,
    client_predictor,
    data_text,
    draw_skipped,
    missing_states,
    model_text,
    round_note,
)
from fedwear.report.plots import Plot, _new_figure, _save
from fedwear.report.rundir import Run

#: The view whose predictor the figure draws, and whose metrics.csv row its caption quotes.
VIEW = "personalized"


@dataclass
class Forecast:
    """One client's test windows in order: true and predicted heart rate in bpm."""

    method: str
    seed: int | str
    round: int
    final_round: object
    client: str
    model: str  # which weights the predictor holds, in words
    data: str  # where the windows came from, in words
    rate_hz: float
    window: int
    target: tuple[float, float]  # (shift, scale): bpm = value * scale + shift
    recording: np.ndarray  # [n] index of each window's recording
    start: np.ndarray  # [n] first sample of each window, at rate_hz
    true_bpm: np.ndarray  # [n] the windows' targets
    pred_bpm: np.ndarray  # [n] the predictor's outputs
    logged: dict[str, float] | None = None  # the run's metrics.csv row of this client and round

    @property
    def time_s(self) -> np.ndarray:
        """Seconds from the start of each window's recording to its target value."""
        return (self.start + self.window) / self.rate_hz

    @property
    def recordings(self) -> list[int]:
        return list(dict.fromkeys(self.recording.tolist()))

    @property
    def errors(self) -> dict[str, float]:
        """mse, mae and mape of the drawn predictions (fedwear's regression metrics)."""
        return regression_metrics(self.true_bpm, self.pred_bpm)


def pick_client(restored: Restored, client: str | None) -> str | Skipped:
    """The training client ``client`` (default: the first), or why there is none to draw."""
    run, data = restored.run, restored.data
    ids = [c.client_id for c in data.clients]
    if not ids:
        return Skipped(run.name, run.seed, "the data has no training client")
    if client is None:
        return ids[0]
    if client in ids:
        return client
    held = " is a held-out new client (it never trained: no personal predictor in the checkpoint)" \
        if client in {c.client_id for c in data.new_clients} else " is not a client of this run"
    shown = ", ".join(ids[:12]) + (", ..." if len(ids) > 12 else "")
    return Skipped(run.name, run.seed, f"client {client!r}{held}; its training clients: {shown}")


def logged_row(run: Run, round: int, client: str) -> dict[str, float] | None:
    """The run's own metrics.csv numbers for ``client`` (personalized view, test split) at
    ``round``, or None when that round was not evaluated."""
    m = run.metrics
    sel = m[(m["round"] == round) & (m["view"] == VIEW) & (m["split"] == "test")
            & (m["client"].astype(str) == client)]
    if sel.empty:
        return None
    row = sel.iloc[0]
    return {k: float(row[k]) for k in ("mse", "mae", "mape") if k in row and pd.notna(row[k])}


def client_forecast(restored: Restored, client: str | None = None) -> Forecast | Skipped:
    """True and predicted heart rate (bpm) of ``client``'s test windows (default: the first
    training client), with the predictor the run evaluated it with at the checkpoint's round."""
    run, cfg, ckpt, m, data = (restored.run, restored.cfg, restored.checkpoint, restored.method,
                               restored.data)
    if data.kind != "regression":
        return Skipped(run.name, run.seed, f"dataset {cfg.dataset.name} is not a forecasting "
                       "(regression) dataset")
    cid = pick_client(restored, client)
    if isinstance(cid, Skipped):
        return cid
    if why := missing_states(m, ckpt):
        return Skipped(run.name, run.seed, why)
    c = next(c for c in data.clients if c.client_id == cid)
    if not len(c.test):
        return Skipped(run.name, run.seed, f"client {cid} has no test windows")
    pred = client_predictor(m, ckpt, c, cfg)
    if pred is None:
        return Skipped(run.name, run.seed, "it has no personal predictor")
    pred = as_predictor(pred)
    out = forward(pred, c.test.x, cfg.evaluation.batch_size, pred.device).float().numpy()
    shift, scale = data.target
    rnd = int(ckpt["round"])
    return Forecast(
        method=run.name, seed=run.seed, round=rnd, final_round=run.summary.get("final_round"),
        client=cid, model=model_text(m), data=data_text(cfg), rate_hz=float(data.rate_hz),
        window=int(data.window), target=(float(shift), float(scale)),
        recording=np.asarray(c.test.recording), start=np.asarray(c.test.start),
        true_bpm=c.test.y.astype(np.float64) * scale + shift,
        pred_bpm=out.reshape(len(c.test), -1)[:, 0].astype(np.float64) * scale + shift,
        logged=logged_row(run, rnd, cid),
    )


def with_gaps(t: np.ndarray, *series: np.ndarray) -> tuple[np.ndarray, ...]:
    """``t`` and ``series`` with a NaN inserted where ``t`` jumps by more than its usual step
    (windows dropped inside a recording), so lines break there instead of bridging the gap."""
    if len(t) < 3:
        return (t, *series)
    steps = np.diff(t)
    cut = np.flatnonzero(steps > 1.5 * np.median(steps)) + 1
    return tuple(np.insert(np.asarray(a, np.float64), cut, np.nan) for a in (t, *series))


def forecast_figure(fc: Forecast | Skipped, color: str = "C1") -> Figure:
    """One panel per recording: true HR (black) and the predictions (``color``) in bpm against
    time in seconds; a single text panel for a skipped run."""
    if isinstance(fc, Skipped):
        fig = _new_figure(6.0, 2.4)
        draw_skipped(fig.add_subplot(), f"{fc.method} (seed {fc.seed})", fc.reason, 60)
        return fig
    recs = fc.recordings
    cols = 1 if len(recs) <= 4 else 2
    rows = math.ceil(len(recs) / cols)
    fig = _new_figure(9.0 if cols == 1 else 12.0, 0.9 + 2.1 * rows)
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True).ravel()
    for ax in axes[len(recs):]:
        ax.set_axis_off()
    t = fc.time_s
    for ax, rec in zip(axes, recs, strict=False):
        sel = fc.recording == rec
        tt, true, pred = with_gaps(t[sel], fc.true_bpm[sel], fc.pred_bpm[sel])
        ax.plot(tt, true, color="black", lw=1.0, label="true")
        ax.plot(tt, pred, color=color, lw=1.0, label=f"{fc.method} (predicted)")
        mae = regression_metrics(fc.true_bpm[sel], fc.pred_bpm[sel])["mae"]
        ax.set(title=f"recording {rec}: {int(sel.sum())} test windows, MAE {mae:.3g} bpm",
               xlabel="time (s)", ylabel="heart rate (bpm)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{fc.method} (seed {fc.seed}, round {fc.round}): client {fc.client}")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=2, frameon=False)
    return fig


def forecast_plot(run: Run, fc: Forecast | Skipped, out: Path, color: str = "C1") -> Plot:
    """``forecast-<name>-s<seed>.png`` (``Run.name``) of one run and its caption."""
    file = f"forecast-{run.name}-s{run.seed}.png"
    _save(forecast_figure(fc, color), out, file)
    title = f"heart rate over time: {run.name} seed {run.seed}"
    short = (f"Predicted and true heart rate over time, one client, {run.name} seed {run.seed} "
             "(PCFedH Fig. 4).")
    return Plot(file, title, short, "forecast", notes=caption(fc))


def _numbers(values: dict[str, float]) -> str:
    return (f"MSE {values['mse']:.4g} bpm², MAE {values['mae']:.4g} bpm, "
            f"MAPE {values['mape']:.4g} %")


def caption(fc: Forecast | Skipped) -> str:
    """What the figure shows: client, checkpoint round, model, units, time axis, errors."""
    if isinstance(fc, Skipped):
        return (f"Heart rate over time (PCFedH, Yin et al. 2025, Fig. 4): skipped {fc.method} "
                f"seed {fc.seed}: {fc.reason}.")
    final = round_note(fc.round, fc.final_round)
    shift, scale = fc.target
    parts = [
        f"Heart rate over time (PCFedH, Yin et al. 2025, Fig. 4): {fc.method} seed {fc.seed}, "
        f"client {fc.client}, its {len(fc.true_bpm)} test-split windows in order, one panel per "
        f"recording ({len(fc.recordings)}; titled by its index among the dataset's series). Black: the true next value (each window's target); "
        f"colour: the prediction of the predictor the run evaluated this client with in the "
        f"{VIEW} view, from {CHECKPOINT} of round {fc.round} ({final}); model: {fc.model}. "
        f"Both in bpm (value x {scale:g} + {shift:g}, the data's target scaling). Time: seconds "
        f"from the start of the recording's series to the target value, (start + {fc.window}) / "
        f"{fc.rate_hz:g} Hz. Data: {fc.data}.",
        f"Over these windows: {_numbers(fc.errors)}.",
    ]
    if fc.logged is not None and {"mse", "mae", "mape"} <= set(fc.logged):
        parts.append(f"The run's metrics.csv ({VIEW}, test, round {fc.round}, client "
                     f"{fc.client}): {_numbers(fc.logged)}.")
    return " ".join(parts)
