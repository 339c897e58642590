"""``fedwear upgrade``: adopt a run folder of format 1 (no marker, pickled checkpoints).

Format 1 folders hold the same CSV files, config and summary as today's, but no
:data:`fedwear.rundir.MARKER`, checkpoints as pickles, and config hashes that counted
``threads``. Adopting one writes the marker and brings its hashes to today's digest; its
pickles are converted only on request (``trust_pickles``), by :func:`fedwear.legacy.convert_run`,
whose loader admits arrays and fedwear's records only. Nothing else in the folder changes.
"""

from __future__ import annotations

import json
from pathlib import Path

from fedwear import rundir
from fedwear.callbacks import CHECKPOINT, LEGACY_CHECKPOINT, load_checkpoint, save_checkpoint
from fedwear.config import load_config
from fedwear.engines.store import FOLDER as STATES_FOLDER
from fedwear.errors import FedwearError


def run_folders(paths: list[Path]) -> list[Path]:
    """The folders with a ``config.yaml`` among ``paths`` and, for the others, below them."""
    found = [p for p in paths if (p / "config.yaml").is_file()]
    found += [c.parent for p in paths if p not in found for c in sorted(p.glob("**/config.yaml"))]
    if not found:
        raise FedwearError(f"no run folder (with a config.yaml) in {', '.join(map(str, paths))}")
    return found


def upgrade_folder(run: Path, trust_pickles: bool = False) -> str:
    """Adopt ``run`` (see the module's docstring); what was done, in a few words."""
    if not rundir.is_run(run) and not rundir.looks_like_old_run(run):
        foreign = ", ".join(rundir.foreign_files(run)[:5])
        raise FedwearError(f"{run} is not a run folder of fedwear (it holds {foreign}): nothing was changed")
    cfg = load_config(run / "config.yaml")
    then, now = cfg.hash(with_threads=True), cfg.hash()
    done = []
    pickles = (run / LEGACY_CHECKPOINT).exists() or any((run / STATES_FOLDER).glob("*.pkl"))
    if pickles and trust_pickles:
        from fedwear.legacy import convert_run

        convert_run(run)
        done.append("checkpoint converted")
    elif pickles:
        done.append(f"{LEGACY_CHECKPOINT} left as it is (pickles are not read: --trust-pickles converts it; "
                    "until then the run can be reported, or reused if it finished, but not resumed)")
    if (run / CHECKPOINT).exists():
        ckpt = load_checkpoint(run / CHECKPOINT)
        if ckpt["config_hash"] == then != now:
            save_checkpoint(run / CHECKPOINT, {**ckpt, "config_hash": now})
            done.append("checkpoint's config hash updated")
    summary_path = run / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        if summary.get("config_hash") == then != now:
            summary["config_hash"] = now
            summary_path.write_text(json.dumps(summary, indent=2))
            done.append("summary's config hash updated")
    if not rundir.is_run(run):
        rundir.write_marker(run)
        done.append("marked as a run folder")
    return "; ".join(done) or "up to date"
