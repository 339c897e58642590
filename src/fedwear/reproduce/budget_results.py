"""The results file of a table in Meta-HAR's shape (its Tables 1 and 2): accuracy of meta-train
users (the training clients, after personalisation) and of meta-test users (held out, after
adaptation), one row per method and fine-tuning budget.

Meta-HAR reports, per set of users, the test-size-weighted mean accuracy (Eq. 6), mean ± std over
5 repetitions with different meta-test users (the Meta-HAR paper, Sec. 1 and 4.2): here each seed draws its own held-out
users, and a cell is the mean ± population std over the seeds of each run's final-round
weighted mean. Methods without budgets give one row (the personalized view; FedAvg's is its
global model); a method with budgets (Meta-HAR's n, FedReptile's k) one row per budget.
"""

from __future__ import annotations

from pathlib import Path

from fedwear.compare import Planned
from fedwear.data.partition import source_of
from fedwear.reproduce import Experiment, paper_table
from fedwear.reproduce.run_files import (
    FLAG,
    context_section,
    cpu_cell,
    delta_cell,
    findings,
    matching_metrics,
    rounds_run,
    runs_cells,
    seed_cell,
)
from fedwear.rundir import RunFolder
from fedwear.summary import aggregate_metrics


def budget_numbers(cfg, where: Path, at_round: int | None = None) -> dict | None:
    """Final-round weighted metrics (%) of each personalized / new_clients view of one run."""
    if (metrics := matching_metrics(cfg, where, at_round)) is None:
        return None

    def final_views(rows) -> dict[str, dict[str, float]]:
        """view -> metric -> the final round's test-weighted mean, in %."""
        agg = aggregate_metrics(rows, cfg.evaluation.client_weights)
        last = agg[(agg["round"] == agg["round"].max()) & (agg["split"] == "test")]
        return {view: {r.metric: 100 * float(r.weighted) for r in g.itertuples()} for view, g in last.groupby("view")}

    tags = [src.label for src in cfg.dataset.sources]  # a merged dataset: the views of each source's users too
    source = metrics["client"].map(lambda c: source_of(str(c), tags))
    return {"rounds": rounds_run(where, at_round), "of": cfg.rounds, "seed": cfg.seed,
            "views": final_views(metrics), "cpu_s": RunFolder(where).cpu_s(at_round),
            "by_source": {t: final_views(metrics[source == t]) for t in tags}}


def _cells(got: list[dict], view: str, metric: str = "accuracy", source: str | None = None) -> list[float | None]:
    """One value per run (seed) of ``view``'s ``metric``, over all users or one source's."""
    return [(n["by_source"].get(source, {}) if source else n["views"]).get(view, {}).get(metric) for n in got]


def budget_lines(exp: Experiment, runs: list[Planned], by_method: dict[str, list[dict]],
                 at_round: int | None = None) -> list[str]:
    paper = paper_table(exp.paper) if exp.paper else {"rows": {}, "source": "none"}
    tags = sorted({t for got in by_method.values() for n in got for t in n["by_source"]})
    extra = [f"meta-{who} {m}" for m in exp.extra_metrics for who in ("train", "test")]
    extra += [f"meta-test {t}" for t in tags]
    lines = [
        "Cells: accuracy in %, weighted by test windows over users (Eq. 6) at the final round, mean ± "
        "population std over the seeds listed (each seed holds out its own meta-test users). Meta-train: the "
        "training users after the method's personalisation; meta-test: held-out users after its adaptation"
        + "".join(f"; meta-train / meta-test {m}: {m} in %, weighted the same way" for m in exp.extra_metrics)
        + ("; meta-test <source>: the accuracy of that source's held-out users" if tags else "")
        + f". Δ = ours − paper; ⚠ where |Δ| > {FLAG:g} points.",
        "",
        "| Method | budget | implementation | seeds | rounds run | meta-train | paper | Δ | meta-test | paper | Δ | "
        + "".join(f"{c} | " for c in extra) + "CPU-s (1 thread) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(extra),
    ]
    warned: set[str] = set()  # methods with a ⚠ in a row
    for method in exp.methods:
        got = by_method[method]
        views = sorted({v for n in got for v in n["views"]})
        budgets = sorted({v.partition("@")[2] for v in views if "@" in v}) or [""]
        for budget in budgets:
            suffix = f"@{budget}" if budget else ""
            train, test = _cells(got, f"personalized{suffix}"), _cells(got, f"new_clients{suffix}")
            ref = paper["rows"].get(f"{method}{suffix}") or [None, None]
            deltas = [delta_cell(train, ref[0]), delta_cell(test, ref[1])]
            if any("⚠" in d for d in deltas):
                warned.add(method)
            more = [_cells(got, f"{view}{suffix}", m) for m in exp.extra_metrics for view in ("personalized", "new_clients")]
            more += [_cells(got, f"new_clients{suffix}", source=t) for t in tags]
            extra_cells = "".join(f"{seed_cell(c)} | " for c in more)
            lines.append(
                f"| {method} | {budget or '-'} | {exp.variants.get(method, '')} | "
                f"{runs_cells(method, got, runs, at_round)} | {seed_cell(train)} | "
                f"{'' if ref[0] is None else ref[0]} | {deltas[0]} | {seed_cell(test)} | "
                f"{'' if ref[1] is None else ref[1]} | {deltas[1]} | {extra_cells}{cpu_cell([n['cpu_s'] for n in got])} |")
    if paper["rows"]:
        lines += ["", f"Paper: {paper['source']}."]
    lines += findings(exp, warned)
    for ref in exp.context:
        lines += context_section(paper_table(ref))
    return lines


__all__ = ["budget_lines", "budget_numbers"]
