"""One look for every figure of a report, sized for a paper.

A figure is drawn at a paper's column width, :data:`SINGLE_COLUMN` or :data:`DOUBLE_COLUMN`
(the IEEE and ACM two-column templates: 3.5 in and 7.16 in; a PNG at 300 dpi or a PDF / SVG
placed at 100 % keeps its fonts at the sizes of :data:`RC`, 7-8 pt, the sizes of a caption). Colours
are Tableau's colour-blind-safe ten (:func:`fedwear.report.plots.colors`). Text in a PDF is
TrueType (Type 42) and in an SVG stays text, so a journal's checks and an editor can read it.

Tick labels never overlap: :func:`fit_tick_labels` measures them with the figure's renderer
and turns them (45°, anchored at their right end) only when they would touch;
:func:`overlapping_labels` lists any pair that does, for the tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import matplotlib
import numpy as np
from matplotlib.path import Path

#: Column widths in inches (IEEE/ACM two-column templates).
SINGLE_COLUMN = 3.5
DOUBLE_COLUMN = 7.16
#: A figure whose content needs more than this many inches goes to the double column.
SINGLE_UP_TO = 5.0

RC = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.title_fontsize": 7,
    "figure.titlesize": 8,
    "axes.linewidth": 0.6,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "lines.linewidth": 1.2,
    "lines.markersize": 4,
    "hatch.linewidth": 0.6,
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "svg.fonttype": "none",
}


@contextmanager
def paper_style() -> Iterator[None]:
    """Figures created inside use :data:`RC` (matplotlib's global settings are restored after)."""
    with matplotlib.rc_context(RC):
        yield


def paper_size(width: float, height: float) -> tuple[float, float]:
    """The figure size for content laid out at ``width`` x ``height`` inches: the single column
    up to :data:`SINGLE_UP_TO` inches, else the double column. A figure made narrower keeps more
    of its height than of its width (by the square root of the ratio; the fonts do not shrink),
    one made wider keeps its height; at least 2.2 and at most 9 inches."""
    column = SINGLE_COLUMN if width <= SINGLE_UP_TO else DOUBLE_COLUMN
    return column, min(9.0, max(2.2, height * min(1.0, (column / width) ** 0.5)))


def _outline(label, renderer) -> Path:
    """The drawn rectangle of a tick label in display pixels: its window extent when it is flat
    or upright, else its rectangle turned about its anchor (``rotation_mode="anchor"``), since
    the extent of a turned label is a much larger upright box."""
    box = label.get_window_extent(renderer)
    if label.get_rotation() % 90 == 0 or label.get_rotation_mode() != "anchor":
        return Path([(box.x0, box.y0), (box.x1, box.y0), (box.x1, box.y1), (box.x0, box.y1), (box.x0, box.y0)])
    w, h, _ = renderer.get_text_width_height_descent(label.get_text(), label.get_fontproperties(), ismath=False)
    xs = {"left": (0, w), "center": (-w / 2, w / 2), "right": (-w, 0)}[label.get_horizontalalignment()]
    ys = {"top": (-h, 0), "center": (-h / 2, h / 2), "center_baseline": (-h / 2, h / 2)}.get(
        label.get_verticalalignment(), (0, h))
    corners = np.array([(xs[0], ys[0]), (xs[1], ys[0]), (xs[1], ys[1]), (xs[0], ys[1]), (xs[0], ys[0])])
    turn = np.deg2rad(label.get_rotation())
    rotation = np.array([[np.cos(turn), -np.sin(turn)], [np.sin(turn), np.cos(turn)]])
    anchor = label.get_transform().transform(label.get_position())
    return Path(corners @ rotation.T + anchor)


def overlapping_labels(fig) -> list[tuple[str, str]]:
    """Pairs of tick labels of one axis of ``fig`` whose drawn rectangles overlap."""
    pairs = []
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            shapes = [(t, _outline(t, renderer)) for t in labels if t.get_visible() and t.get_text()]
            pairs += [(a.get_text(), b.get_text()) for i, (a, shape_a) in enumerate(shapes)
                      for b, shape_b in shapes[i + 1:] if shape_a.intersects_path(shape_b, filled=True)]
    return pairs


def fit_tick_labels(*axes, gap_pt: float = 2.0) -> None:
    """Turn an axis's x tick labels 45° (anchored at their right end) when, drawn flat, two
    neighbours would come closer than ``gap_pt`` points; long labels on a narrow axis then stay
    apart. Call it once the axes (of one figure), their labels and the figure's size are set: the
    figure is drawn once for all of them."""
    fig = axes[0].figure
    fig.canvas.draw()  # the constrained layout places the axes: the labels' boxes are final
    renderer = fig.canvas.get_renderer()
    gap = gap_pt * fig.dpi / 72
    for ax in axes:
        boxes = sorted((t.get_window_extent(renderer) for t in ax.get_xticklabels()
                        if t.get_visible() and t.get_text()), key=lambda b: b.x0)
        if any(b.x0 - a.x1 < gap for a, b in zip(boxes, boxes[1:], strict=False)):
            for label in ax.get_xticklabels():
                label.set(rotation=45, ha="right", rotation_mode="anchor")
