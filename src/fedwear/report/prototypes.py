"""t-SNE of PCFedH's encoder features, coloured by nearest global prototype (PCFedH, Yin et al.,
FITEE 2025, Fig. 3: the representations of PCFedH's cluster-representation encoder beside the
original data).

For a run whose method has a cluster space (:meth:`fedwear.methods.api.Method.cluster_space`:
PCFedH's TS2Vec encoder from the checkpoint's server state, in eval mode, and its global
prototypes), a uniform sample of the training clients' train windows goes through it: the
features PCFedH clusters (max over time, L2-normalised). Each window is coloured by its nearest prototype (cosine, as PCFedH counts
windows per cluster). Left panel: t-SNE of those features with the prototypes; right panel:
t-SNE of the same windows' raw values (the paper's "original representation").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.lines import Line2D

from fedwear.callbacks import CHECKPOINT
from fedwear.report.embeddings import (
    TSNE_TEXT,
    Restored,
    Skipped,
    _class_color,
    data_text,
    draw_skipped,
    round_note,
    tsne,
)
from fedwear.report.plots import Plot, _new_figure, _save
from fedwear.report.rundir import Run

#: Default number of train windows drawn (t-SNE time grows with it: about 8 s for 500 points
#: on one busy core, twice per figure).
TSNE_WINDOWS = 500
SAMPLE_SEED = 0


@dataclass
class EncoderFeatures:
    """Encoder features of a sample of the training clients' train windows."""

    method: str
    seed: int | str
    round: int
    final_round: object
    z: np.ndarray  # [n, q] instance representations (L2-normalised)
    raw: np.ndarray  # [n, window * channels] the same windows as the model sees them
    nearest: np.ndarray  # [n] index of the nearest global prototype
    protos: np.ndarray  # [K, q] the global prototypes, L2-normalised
    client: np.ndarray  # [n] client id of each window
    total: int  # train windows before sampling
    encoder: str  # the encoder's class and sizes, in words
    data: str = ""


def sample(total: int, k: int, seed: int = SAMPLE_SEED) -> np.ndarray:
    """``min(k, total)`` indices of ``range(total)`` drawn uniformly without replacement, sorted."""
    return np.sort(np.random.default_rng(seed).choice(total, size=min(k, total), replace=False))


def nearest_prototype(z: np.ndarray, protos: np.ndarray) -> np.ndarray:
    """Index of the prototype of highest cosine similarity to each row of ``z``."""
    c = F.normalize(torch.from_numpy(np.asarray(protos, np.float32)), dim=-1)
    return (torch.from_numpy(np.asarray(z, np.float32)) @ c.T).argmax(dim=1).numpy()


def encoder_features(restored: Restored, windows: int = TSNE_WINDOWS
                     ) -> EncoderFeatures | Skipped | None:
    """Features of ``windows`` train windows sampled from all training clients (None: the run's
    server state has no PCFedH encoder and prototypes)."""
    run, ckpt, data = restored.run, restored.checkpoint, restored.data
    space = restored.method.cluster_space(ckpt["server"].arrays)
    if space is None:
        return None
    if isinstance(space, str):
        return Skipped(run.name, run.seed, space)
    clients = [c for c in data.clients if len(c.train)]
    if not clients:
        return Skipped(run.name, run.seed, "its training clients have no train windows")
    x = np.concatenate([c.train.x for c in clients])
    owner = np.concatenate([np.full(len(c.train), c.client_id, dtype=object) for c in clients])
    idx = sample(len(x), windows)
    raw = x[idx].reshape(len(idx), -1)
    if space.encode is None:
        z = F.normalize(torch.from_numpy(raw).float(), dim=-1).numpy()
    else:
        z = space.encode(x[idx])
    protos = F.normalize(torch.from_numpy(space.prototypes), dim=-1).numpy()
    return EncoderFeatures(
        method=run.name, seed=run.seed, round=int(ckpt["round"]),
        final_round=run.summary.get("final_round"), z=z, raw=raw,
        nearest=nearest_prototype(z, protos), protos=protos, client=owner[idx], total=len(x),
        encoder=space.text, data=data_text(restored.cfg),
    )


def _why_not_tsne(f: EncoderFeatures) -> str | None:
    if len(f.z) < 2:
        return "fewer than 2 train windows"
    if not (np.isfinite(f.z).all() and np.isfinite(f.protos).all()):
        return "its encoder features or prototypes hold NaN or inf"
    return None


def prototype_plot(run: Run, f: EncoderFeatures | Skipped, out: Path) -> Plot:
    """``prototypes-<name>-s<seed>.png``: encoder features (with the prototypes) and raw
    windows, each its own t-SNE, coloured by nearest prototype."""
    if isinstance(f, EncoderFeatures) and (why := _why_not_tsne(f)):
        f = Skipped(f.method, f.seed, why)
    file = f"prototypes-{run.name}-s{run.seed}.png"
    if isinstance(f, Skipped):
        fig = _new_figure(6.0, 2.4)
        draw_skipped(fig.add_subplot(), f"{f.method} (seed {f.seed})", f.reason, 60)
    else:
        k = len(f.protos)
        fig = _new_figure(8.0, 4.3)
        left, right = fig.subplots(1, 2)
        palette = [_class_color(i, k) for i in range(k)]
        colors = [palette[i] for i in f.nearest]
        xy = tsne(np.concatenate([f.z, f.protos]))
        points, stars = xy[:len(f.z)], xy[len(f.z):]
        left.scatter(points[:, 0], points[:, 1], s=4, c=colors, linewidths=0, alpha=0.8)
        left.scatter(stars[:, 0], stars[:, 1], s=120, marker="*", edgecolors="black",
                     linewidths=0.8, c=palette)
        left.set(title=f"encoder features (q = {f.z.shape[1]}) and prototypes", xticks=[], yticks=[])
        raw = tsne(f.raw)
        right.scatter(raw[:, 0], raw[:, 1], s=4, c=colors, linewidths=0, alpha=0.8)
        right.set(title=f"raw windows ({f.raw.shape[1]} values)", xticks=[], yticks=[])
        counts = np.bincount(f.nearest, minlength=k)
        handles = [Line2D([], [], ls="", marker="o", markersize=5, color=c) for c in palette]
        labels = [f"prototype {i} ({counts[i]})" for i in range(k)]
        fig.legend(handles, labels, loc="outside lower center", frameon=False,
                   ncol=min(k, 5), title="nearest global prototype (windows)")
        fig.suptitle(f"{f.method} (seed {f.seed}, round {f.round}): {len(f.z)} train windows, "
                     f"{len(set(f.client))} clients")
    _save(fig, out, file)
    return Plot(file, f"t-SNE of encoder features: {run.name} seed {run.seed}",
                f"t-SNE of PCFedH's encoder features, coloured by nearest global prototype, {run.name} seed "
                f"{run.seed} (PCFedH Fig. 3).", "prototypes", notes=caption(f))


def caption(f: EncoderFeatures | Skipped) -> str:
    """What the figure shows: windows and their sampling, encoder, colours, t-SNE settings."""
    if isinstance(f, Skipped):
        return (f"t-SNE of PCFedH encoder features (PCFedH, Yin et al. 2025, Fig. 3): skipped "
                f"{f.method} seed {f.seed}: {f.reason}.")
    final = round_note(f.round, f.final_round)
    return (
        f"t-SNE of PCFedH encoder features (PCFedH, Yin et al. 2025, Fig. 3): {f.method} seed "
        f"{f.seed}, {CHECKPOINT} of round {f.round} ({final}). Windows: {len(f.z)} of the "
        f"{f.total} train-split windows of the {len(set(f.client))} training clients, drawn uniformly "
        f"without replacement (seed {SAMPLE_SEED}; --tsne-windows sets how many). Left: each "
        f"window's instance representation (max over time, L2-normalised) from the run's global "
        f"encoder (server state enc.*, {f.encoder}, sizes from method_options.pcfedh) in eval "
        "mode (no timestamp masking, no dropout; PCFedH's code counts in train mode, with random "
        f"masking), and the {len(f.protos)} global prototypes (stars, server state proto) in the "
        "same t-SNE. Right: the same windows' raw values as the model sees them (the paper's "
        "original representation). Colour: the nearest global prototype (cosine similarity) of "
        f"each window's encoder features. Each panel is its own t-SNE: {TSNE_TEXT} (on the left "
        f"n counts the prototypes too); the axes have no units. Data: {f.data}."
    )
