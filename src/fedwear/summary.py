"""summary.json from a run directory's CSV files (so a resumed run gets the same summary)."""

from __future__ import annotations

import math

import pandas as pd
from pydantic import BaseModel, ConfigDict, ValidationError

from fedwear.config import METRICS, RunConfig, task_kind
from fedwear.data import dataset_label
from fedwear.errors import FedwearError
from fedwear.evaluation.metrics import LOWER_IS_BETTER, client_weights, summarize
from fedwear.version import library_versions


def metric_columns(metrics: pd.DataFrame) -> list[str]:
    """The metric columns of a metrics.csv frame: every numeric column but the ids and ``n``,
    the classification metrics first (in ``METRICS`` order), then the others in frame order."""
    ids = ("round", "client", "view", "split", "n")
    cols = [c for c in metrics.columns if c not in ids and pd.api.types.is_numeric_dtype(metrics[c])]
    return [m for m in METRICS if m in cols] + [c for c in cols if c not in METRICS]


def aggregate_metrics(metrics: pd.DataFrame, weights: str = "test") -> pd.DataFrame:
    """One row per (round, view, split, metric) with weighted / mean / std / worst10 over clients
    (``weights``: ``evaluation.client_weights``)."""
    out = []
    names = [c for c in metric_columns(metrics) if c != "n_train"]
    for (r, view, split), g in metrics.groupby(["round", "view", "split"], sort=True):
        n_train = g["n_train"].to_numpy(float) if "n_train" in g else None
        w = client_weights(weights, g["n"].to_numpy(float), n_train)
        for metric in names:
            s = summarize(g[metric].to_numpy(float), w, lower_is_better=metric in LOWER_IS_BETTER)
            out.append({"round": r, "view": view, "split": split, "metric": metric, **s, "clients": len(g)})
    return pd.DataFrame(out, columns=["round", "view", "split", "metric", "weighted", "mean", "std", "worst10", "clients"])


def _clean(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def best_round(agg: pd.DataFrame, rule: str, split: str, statistic: str) -> int | None:
    """The earliest round where ``rule`` (view.metric) is best by ``statistic`` on ``split``
    (``per_client`` ranks rounds by the unweighted mean)."""
    statistic = "mean" if statistic == "per_client" else statistic
    view, _, metric = rule.partition(".")
    crit = agg[(agg["view"] == view) & (agg["metric"] == metric) & (agg["split"] == split)]
    crit = crit.dropna(subset=[statistic])
    if not len(crit):
        return None
    col = crit[statistic]
    return int(crit.loc[col.idxmin() if metric in LOWER_IS_BETTER else col.idxmax(), "round"])


def per_client_best(metrics: pd.DataFrame, rule: str, split: str) -> dict:
    """Each client's own best round by ``rule`` (view.metric) on ``split`` (the earliest), and
    every view's test metrics of each client at its round: unweighted mean and population std
    over clients (FedAli's Local: the best epoch per client, chosen on its test set)."""
    view, _, metric = rule.partition(".")
    crit = metrics[(metrics["view"] == view) & (metrics["split"] == split)].dropna(subset=[metric])
    crit = crit.sort_values(["client", "round"], kind="stable")
    pick = crit.groupby("client")[metric].idxmin() if metric in LOWER_IS_BETTER else crit.groupby("client")[metric].idxmax()
    rounds = {str(c): int(crit.loc[i, "round"]) for c, i in pick.items()}
    test = metrics[metrics["split"] == "test"]
    at = test[[rounds.get(str(c)) == r for c, r in zip(test["client"], test["round"], strict=True)]]
    out: dict = {"rounds": rounds}
    for v, g in at.groupby("view", sort=True):
        out[v] = {m: {"mean": _clean(g[m].mean()), "std": _clean(g[m].std(ddof=0))}
                  for m in metric_columns(g) if m != "n_train"}
    return out


def _at(agg: pd.DataFrame, round: int, stat: str = "weighted") -> dict[str, dict[str, float | None]]:
    sel = agg[(agg["round"] == round) & (agg["split"] == "test")]
    out: dict[str, dict[str, float | None]] = {}
    for row in sel.itertuples():
        out.setdefault(row.view, {})[row.metric] = _clean(getattr(row, stat))
    return out


def _stats_at(agg: pd.DataFrame, round: int) -> dict[str, dict[str, dict[str, float | None]]]:
    sel = agg[(agg["round"] == round) & (agg["split"] == "test")]
    out: dict = {}
    for row in sel.itertuples():
        out.setdefault(row.view, {})[row.metric] = {
            k: _clean(getattr(row, k)) for k in ("weighted", "mean", "std", "worst10")
        }
    return out


def coverage(metrics: pd.DataFrame, at: dict[str, int]) -> tuple[dict[str, int], dict[str, list[str]]]:
    """For each view of ``at`` (view -> round): how many clients its test-split values there
    cover, and which clients are missing: those with a test row of that view in another
    evaluated round of the run but none in that one (a client that dropped out, a node that died).

    Every evaluated round evaluates every client, so a client seen once should be in each; the
    means in ``final``/``best`` are over the clients present, and the missing ones are named so
    that a mean over fewer clients is never taken for one over all of them."""
    test = metrics[metrics["split"] == "test"]
    clients = test["client"].astype(str)
    counts: dict[str, int] = {}
    missing: dict[str, list[str]] = {}
    for view, r in sorted(at.items()):
        of_view = test["view"] == view
        present = set(clients[of_view & (test["round"] == r)])
        counts[view] = len(present)
        gone = sorted(set(clients[of_view]) - present)
        if gone:
            missing[view] = gone
    return counts, missing


def build_summary(cfg: RunConfig, metrics: pd.DataFrame, rounds: pd.DataFrame, wall_time_s: float,
                  version: str) -> dict:
    """summary.json's content. ``final`` and ``best`` are over the clients with rows in that
    round; ``n_clients`` says how many those are per view and ``missing`` names the clients
    evaluated in other rounds that have none there (:func:`coverage`); ``task`` picks the
    metrics a table shows when no round was evaluated."""
    ev = cfg.evaluation
    agg = aggregate_metrics(metrics, ev.client_weights)
    evaluated = sorted(agg["round"].unique().tolist())
    final_round = int(evaluated[-1]) if evaluated else None
    headline = best_round(agg, ev.best_metric, ev.best_split, ev.best_statistic)
    headline = final_round if headline is None else headline
    best_rounds: dict[str, int] = {}
    best: dict = {}
    best_stats: dict = {}
    for view in sorted(agg["view"].unique()):
        rule = ev.best_for.get(view)
        r = headline if rule is None else best_round(agg, rule, ev.best_split, ev.best_statistic)
        if r is None:
            continue
        best_rounds[view] = r
        best.update({k: v for k, v in _at(agg, r).items() if k == view})
        best_stats.update({k: v for k, v in _stats_at(agg, r).items() if k == view})
    rounds_to_target = {}
    for key, target in ev.targets.items():
        tv, _, tm = key.partition(".")
        sel = agg[(agg["view"] == tv) & (agg["metric"] == tm) & (agg["split"] == "test")]
        value = sel[ev.best_statistic]
        hit = sel[value <= target] if tm in LOWER_IS_BETTER else sel[value >= target]
        rounds_to_target[key] = int(hit["round"].min()) if len(hit) else None
    views = sorted(set(metrics.loc[metrics["split"] == "test", "view"]))
    final_n, final_missing = coverage(metrics, {v: final_round for v in views} if final_round is not None else {})
    best_n, best_missing = coverage(metrics, best_rounds)
    extra = {}
    if ev.best_statistic == "per_client":
        extra["per_client_best"] = per_client_best(metrics, ev.best_metric, ev.best_split)
    return {
        "method": cfg.method,
        "dataset": dataset_label(cfg.dataset),
        "final": _at(agg, final_round) if final_round is not None else {},
        "best": best,
        "best_rule": _best_rule(cfg),
        "best_round": headline,
        "best_rounds": best_rounds,
        "final_round": final_round,
        "final_stats": _stats_at(agg, final_round) if final_round is not None else {},
        "best_stats": best_stats,
        "n_clients": {"final": final_n, "best": best_n},
        "missing": {"final": final_missing, "best": best_missing},
        "task": task_kind(cfg),
        "client_weights": ev.client_weights,
        "rounds_to_target": rounds_to_target,
        "bytes_up": int(rounds["bytes_up"].sum()) if len(rounds) else 0,
        "bytes_down": int(rounds["bytes_down"].sum()) if len(rounds) else 0,
        "eval_bytes_up": int(rounds["eval_bytes_up"].sum()) if len(rounds) else 0,
        "eval_bytes_down": int(rounds["eval_bytes_down"].sum()) if len(rounds) else 0,
        "failed_rounds": [int(r) for r in rounds.loc[rounds["aggregated"] == 0, "round"]],
        "rejected_evaluations": rejected_evaluations(rounds),
        "evaluated_by": EVALUATED_BY["deployment" if cfg.engine == "flower" else "fedwear"],
        "wall_time_s": float(wall_time_s),
        "seed": cfg.seed,
        "engine": cfg.engine,
        "auc_averaging": ev.auc,
        "fedwear_version": version,
        "versions": library_versions(),
        "config_hash": cfg.hash(),
        "metric_notes": f"final/best: weighted mean over clients (weights: {ev.client_weights} windows); "
        "*_stats add the unweighted mean, population std over clients and the mean of the worst decile "
        "of clients (the lowest scores; the highest errors for mse, mae, mape, loss); all over the "
        "clients with a row in that round (n_clients per view); missing: clients evaluated in other "
        "rounds with no row in that one, left out of its means",
        "bytes_notes": "bytes_*: training messages (array payloads); eval_bytes_down: each evaluated "
        "client's message plus the global model; eval_bytes_up: 8 bytes per reported metric value",
        **extra,
    }


#: Who computed the metrics of summary.json (its ``evaluated_by``).
EVALUATED_BY = {
    "fedwear": "fedwear's own evaluation of every client, in this run's processes",
    "deployment": "each Flower node's own report: the server checked every row against the windows that node "
    "declared, the metrics' ranges and its confusion counts (fedwear.engines.rows), but cannot recompute "
    "them; rows it refused are in rejected_evaluations, never in the means",
}


def rejected_evaluations(rounds: pd.DataFrame) -> dict[str, list[str]]:
    """Round -> the clients whose evaluation rows that round were refused (rounds.csv ``rejected``;
    a folder written before fedwear checked rows has none)."""
    if "rejected" not in rounds:
        return {}
    out = {}
    for r, text in zip(rounds["round"], rounds["rejected"], strict=True):
        if isinstance(text, str) and text:
            out[str(int(r))] = [part.split(":", 1)[0] for part in text.split(";")]
    return out


def _best_rule(cfg: RunConfig) -> str:
    ev = cfg.evaluation
    stat = {"weighted": f"{ev.client_weights}-weighted", "mean": "unweighted",
            "per_client": "unweighted"}[ev.best_statistic]

    def one(rule: str) -> str:
        best = "min" if rule.partition(".")[2] in LOWER_IS_BETTER else "max"
        return f"the earliest round with the {best} {stat} mean of {rule} on the {ev.best_split} split"
    text = one(ev.best_metric)
    if ev.best_statistic == "per_client":
        text += (f"; per_client_best: each client's earliest best round of {ev.best_metric} on its own "
                 f"{ev.best_split} split")
    for view, rule in sorted(ev.best_for.items()):
        text += f"; {view}: {one(rule)}"
    return text


__all__ = ["aggregate_metrics", "build_summary", "coverage"]


Number = float | None  # NaN is written as null by some tools, and as NaN by json


class SummaryFile(BaseModel):
    """The parts of summary.json that fedwear reads back (the report, compare's table, reuse of a
    finished run), typed; other keys pass as they are. Missing parts default as an older
    fedwear wrote them."""

    model_config = ConfigDict(extra="allow")
    method: str | None = None
    seed: int | None = None
    final: dict[str, dict[str, Number]]
    best: dict[str, dict[str, Number]] = {}
    final_stats: dict[str, dict[str, dict[str, Number]]] = {}
    best_stats: dict[str, dict[str, dict[str, Number]]] = {}
    final_round: int | None = None
    best_round: int | None = None
    best_rounds: dict[str, int] = {}
    n_clients: dict[str, dict[str, int]] = {}
    missing: dict[str, dict[str, list]] = {}
    failed_rounds: list[int] = []
    wall_time_s: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    eval_bytes_up: int = 0
    eval_bytes_down: int = 0
    config_hash: str | None = None


def read_summary(data: object, path: object) -> dict:
    """``data`` (summary.json parsed) checked as :class:`SummaryFile`; a one-line FedwearError
    naming ``path``, the first wrong key and the fix otherwise."""
    if not isinstance(data, dict) or not isinstance(data.get("final"), dict):
        raise FedwearError(f"{path} has no 'final' results; rerun the experiment with `fedwear run`")
    try:
        SummaryFile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(k) for k in err["loc"])
        raise FedwearError(f"{path}: {key} is {err['input']!r} ({err['msg'].lower()}); rerun the experiment "
                           "with `fedwear run` (or finish it with --resume)") from None
    return data
