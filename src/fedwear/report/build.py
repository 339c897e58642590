"""``fedwear report``: read a run or comparison directory, write the PNGs and index.html."""

from __future__ import annotations

from html import escape
from pathlib import Path

from fedwear import files
from fedwear.errors import FedwearError
from fedwear.report import html
from fedwear.report.classes import (
    NO_FILE,
    classification_plots,
    is_classification,
    missing_confusion,
    runs_text,
)
from fedwear.report.headline import PaperNumbers, headline_plot
from fedwear.report.plots import (
    Groups,
    Plot,
    bytes_plot,
    cost_plot,
    curve_plot,
    distribution_plots,
    figure_format,
    flat,
    loss_plot,
    privacy_plot,
    timing_plot,
)
from fedwear.report.regression import TSNE_WINDOWS, regression_plots, regression_runs
from fedwear.report.rundir import Comparison, Run, load, unlike_seeds
from fedwear.rundir import SUBFOLDER_FILES, refuse_links


def all_plots(groups: Groups, out: Path, reference: str | None = None,
              paper: PaperNumbers | None = None) -> list[Plot]:
    """Every figure of the report that needs no data or checkpoint, written to ``out``, in page
    order: the headline (:func:`~fedwear.report.headline.headline_plot`), the curves, the
    per-client distributions, the per-class figures (:mod:`fedwear.report.classes`), the cost,
    then bytes, training loss and wall time."""
    plots = [headline_plot(groups, out, reference, paper), curve_plot(groups, out),
             *distribution_plots(groups, out), *classification_plots(groups, out)[0], cost_plot(groups, out),
             privacy_plot(groups, out),
             bytes_plot(groups, out, "up"), bytes_plot(groups, out, "down"), loss_plot(groups, out),
             timing_plot(groups, out)]
    return [p for p in plots if p]  # headline, curves, cost: None when no round was evaluated


def _config_values(runs: list[Run], *keys: str) -> str:
    """Distinct values of a (dotted) config key over ``runs``, comma-separated."""
    values = []
    for run in runs:
        v: object = run.config
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        if v is not None and str(v) not in values:
            values.append(str(v))
    return ", ".join(values) or "?"


def _stop_text(run: Run) -> str:
    """An unfinished run: where it stopped and what its run.log says of the end."""
    end = run.log_end
    told = (f"run.log: {escape(end)}" if end else
            "run.log records no end: the run is still going, or it was killed")
    return f"<b>unfinished</b>: {escape(run.stopped_at)} (no summary.json); {told}"


def _run_meta(run: Run) -> list[str]:
    s = run.summary
    mb = f"{s.get('bytes_up', 0) / 1e6:.3f} MB up, {s.get('bytes_down', 0) / 1e6:.3f} MB down"
    dataset = str(s.get("dataset") or _config_values([run], "dataset", "name"))  # older summaries: the name
    rounds = _config_values([run], "rounds")
    evaluated = (f"final round {s.get('final_round')}, best round {s.get('best_round')}" if run.evaluated
                 else "no round evaluated yet")
    return [
        f"method <b>{escape(run.method)}</b>, seed {escape(str(run.seed))}, dataset "
        f"{escape(dataset)}, {escape(rounds)} rounds, engine {escape(str(s.get('engine', '?')))}",
        *([_stop_text(run)] if run.unfinished else []),
        f"{evaluated}; {mb}; wall time {float(s.get('wall_time_s', 0.0)):.1f} s",
        f"config hash <code>{escape(str(s.get('config_hash', '?')))[:16]}</code>, fedwear "
        f"{escape(str(s.get('fedwear_version', '?')))}; "
        f"run directory <code>{escape(str(run.path))}</code>",
    ]


def _comparison_meta(cmp: Comparison) -> list[str]:
    runs = cmp.all_runs
    seeds = "; ".join(f"{m}: {', '.join(str(r.seed) for r in rs)}" for m, rs in cmp.runs.items())
    table = cmp.path / files.TABLE_MD
    return [
        f"{len(cmp.runs)} method(s): <b>{escape(', '.join(cmp.runs))}</b>; "
        f"seeds {escape(seeds)}",
        f"dataset {escape(_config_values(runs, 'dataset', 'name'))}, "
        f"{escape(_config_values(runs, 'rounds'))} rounds",
        f"comparison directory <code>{escape(str(cmp.path))}</code>"
        + (f"; its table: <code>{escape(str(table))}</code>" if table.is_file() else ""),
        *([f"<b>seeds not alike</b> (a mean over them mixes these): {escape('; '.join(unlike))}"]
          if (unlike := unlike_seeds(cmp.runs)) else []),
    ]


def _table_caption(run: Run) -> str:
    """The caption of a run's table (none when no round was evaluated: no table)."""
    return f'<div class="caption">{html.run_table_caption(run)}</div>' if run.evaluated else ""


def _comparison_tables(cmp: Comparison, reference: str | None = None) -> str:
    groups: Groups = cmp.runs
    parts = ["<h2>Summary over seeds</h2>"]
    for select in ("final", "best"):
        parts.append(f"<h3>{select} round</h3>{html.comparison_table(groups, select, reference)}"
                     f'<div class="caption">{html.comparison_caption(select, groups)}</div>')
    if unfinished := [run.label + ("" if run.evaluated else ", no round evaluated yet")
                      for run in cmp.all_runs if run.unfinished]:
        parts.append(f'<p class="caption">Read as far as they got (no summary.json yet): {escape("; ".join(unfinished))}.</p>')
    parts.append("<h3>Each run</h3>")
    for run in cmp.all_runs:
        parts.append(f"<details><summary>{escape(run.label)} ({escape(run.path.name)})</summary>"
                     f"{html.run_table(run, prefix=f'{run.path.name}/')}{_table_caption(run)}</details>")
    return "".join(parts)


def _empty_sections(groups: Groups, plots: list[Plot]) -> dict[str, str]:
    """Why the per-round and per-client figures are missing when no run evaluated a round, and
    why the per-class ones are (no confusion.csv: a run older than the file)."""
    runs = flat(groups)
    if not any(r.evaluated for r in runs):
        why = html.not_evaluated(runs[0]) if len(runs) == 1 else "No round evaluated yet: no run's metrics.csv holds a row."
        return {"curves": why, "clients": why}
    if any(p.section == "classes" for p in plots) or not any(is_classification(r) for r in runs):
        return {}
    if missing := missing_confusion(groups):
        return {"classes": f"No confusion matrix or per-class F1: {NO_FILE}: {runs_text(missing)}."}
    return {"classes": "No confusion matrix or per-class F1: the runs' confusion.csv holds no test-split row of "
                       "the personalized or new_clients view at their final round."}


def write_report(path: Path, out: Path | None = None, embeddings: bool = False,
                 root: Path | None = None, forecast: bool = True, client: str | None = None,
                 tsne_windows: int = TSNE_WINDOWS, command: str | None = None, *,
                 reference: str | None = None, paper: PaperNumbers | None = None, fmt: str = "png") -> Path:
    """Write the PNG figures and ``index.html`` for the run or comparison at ``path`` into ``out``
    (default ``path/report``); returns the path of ``index.html``. ``reference``: the method the
    headline figure and the tables mark (default the comparison's first); ``paper``: the
    published numbers drawn beside ours (default none, and the headline's caption says so). With
    ``embeddings``, also the t-SNE of each method's body embeddings
    (:mod:`fedwear.report.embeddings`; it loads the data, from ``root`` when given). With
    ``forecast`` (default), regression runs also get PCFedH's Fig. 4 and Fig. 3
    (:mod:`fedwear.report.regression`: heart rate over time of ``client``, default the first
    training client, and the t-SNE of ``tsne_windows`` train windows through PCFedH's encoder;
    they load the data too)."""
    target = load(Path(path))
    if out is None:  # the run folder's own: nothing is written through a link there
        refuse_links(Path(path), files.REPORT)
    out = Path(out) if out is not None else Path(path) / files.REPORT
    groups: Groups = {target.name: [target]} if isinstance(target, Run) else target.runs
    if reference is not None and reference not in groups:
        raise FedwearError(f"--reference {reference!r} is not a method of {path} ({', '.join(groups)}): "
                           "name one of them")
    regression = forecast and bool(regression_runs(groups))
    if root is not None and not embeddings and not regression:
        raise FedwearError("--root is only used with --embeddings or by the heart-rate figures of "
                           "a regression run: add --embeddings or drop --root")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for pattern in SUBFOLDER_FILES[files.REPORT]:  # an earlier report's files, which may no longer apply
            for old in out.glob(pattern):
                if old.is_file() and not old.is_symlink():
                    old.unlink()
        if isinstance(target, Run):
            title = f"fedwear report: {target.path.name} ({target.label})"
            meta = _run_meta(target)
            tables = f"<h2>Summary</h2>{html.run_table(target)}{_table_caption(target)}"
        else:
            title = f"fedwear comparison: {target.path.name}"
            meta, tables = _comparison_meta(target), _comparison_tables(target, reference or next(iter(groups)))
        tables += html.privacy_and_cost(flat(groups))
        if command:
            meta = [f"made by <code>{escape(command)}</code>", *meta]
        with figure_format(fmt):  # pdf / svg: each figure also as a vector file
            plots = all_plots(groups, out, reference=reference, paper=paper)
            if embeddings:
                from fedwear.report.embeddings import embedding_plot  # loads data and checkpoints

                plots.append(embedding_plot(groups, out, root))
            if regression:  # loads data and checkpoints
                plots += regression_plots(groups, out, root, client, tsne_windows)
        index = out / "index.html"
        index.write_text(html.page(title, meta, tables, plots, out, _empty_sections(groups, plots)), encoding="utf-8")
    except OSError as e:
        raise FedwearError(f"{out}: cannot write the report ({e.strerror or e}); "
                           "pass --out with a writable folder") from None
    return index
