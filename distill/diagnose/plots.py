"""PNG plots of a run's curves (whichever keys it logged), and the shared figure plumbing.

matplotlib is imported inside functions (it costs ~1 s) and used through `Figure` + the Agg
canvas, never pyplot: no global figure state, no GUI backend, nothing left open.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from distill.diagnose.records import RunRecord, Series

# Curves beyond this many points are thinned for drawing (10,000-step runs stay fast); every point
# still counts in the rules.
MAX_POINTS = 2000


@dataclass(frozen=True)
class PlotSpec:
    name: str
    title: str
    ylabel: str
    keys: tuple[str, ...]
    # Plotted against a right-hand axis (a different unit).
    right_keys: tuple[str, ...] = ()
    right_label: str = ""
    unit_range: bool = False
    # Horizontal lines at the thresholds diagnose judges this plot by: (y, label).
    lines: tuple[tuple[float, str], ...] = ()


SPECS = (
    PlotSpec(
        "loss", "training loss", "loss", ("train/loss", "train/ce_loss"), ("train/grad_norm",), "grad norm"
    ),
    PlotSpec(
        "kl",
        "teacher-student KL",
        "nats / token",
        ("kl/reverse_kl_mean", "kl/reverse_kl_std"),
        ("kl/advantage_mean",),
        "advantage mean",
    ),
    PlotSpec(
        "truncation",
        "truncation rate (ended at the budget without EOS)",
        "share of sequences",
        ("student/truncation_rate", "teacher/truncation_rate", "eval/*/truncation_rate"),
        unit_range=True,
        lines=((0.5, "error: most samples cut"), (0.2, "warning")),
    ),
    PlotSpec(
        "budget",
        "teacher budget use and supervision coverage",
        "share",
        ("teacher/ce_target_share", "coverage/supervised_share"),
        unit_range=True,
        lines=((0.9, "error: teacher fills its budget"), (0.25, "coverage warning")),
    ),
    PlotSpec(
        "eval",
        "student eval",
        "score",
        ("eval/*/avg@*", "eval/*/pass@*", "eval/*/score", "eval/*/success", "eval/*/pass_gt0"),
        unit_range=True,
    ),
)


def new_figure(width: float = 7.5, height: float = 4.2) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Fixed margins, not constrained layout: the layout solver alone doubled the time per plot.
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=0.1, right=0.88, top=0.9, bottom=0.13, hspace=0.45)
    FigureCanvasAgg(fig)
    return fig


def save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def integer_steps(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    # Few ticks: tick labels are most of the drawing time, and a reader needs only a handful.
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6))


def thin(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if steps.size <= MAX_POINTS:
        return steps, values
    idx = np.linspace(0, steps.size - 1, MAX_POINTS).astype(np.int64)
    return steps[idx], values[idx]


def draw(ax: Any, s: Series, label: str | None = None, **style: Any) -> None:
    x, y = thin(s.steps, s.values)
    marker = "o" if x.size <= 30 else None
    ax.plot(x, y, marker=marker, markersize=4, linewidth=1.4, label=label or s.key, **style)


def _match(pattern: str, key: str) -> bool:
    """`eval/*/avg@*`: `*` matches one path segment, or the rest of the last one."""
    p_parts, k_parts = pattern.split("/"), key.split("/")
    if len(p_parts) != len(k_parts):
        return False
    for p, k in zip(p_parts, k_parts, strict=True):
        if p == "*":
            continue
        if p.endswith("*") and k.startswith(p[:-1]):
            continue
        if p != k:
            return False
    return True


def keys_for(rec: RunRecord, patterns: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for pattern in patterns:
        for key in sorted(rec.series):
            if key not in out and _match(pattern, key) and rec.get(key) is not None:
                out.append(key)
    return out


def _drop_duplicate_eval(keys: list[str]) -> list[str]:
    # avg@1 and pass@1 are the same number when k=1; draw one of them.
    return [k for k in keys if not (k.endswith("/avg@1") and k[: -len("avg@1")] + "pass@1" in keys)]


def plot_run(rec: RunRecord, out_dir: Path) -> list[Path]:
    """One PNG per spec whose keys the run logged; returns the files written."""
    written: list[Path] = []
    for spec in SPECS:
        keys = _drop_duplicate_eval(keys_for(rec, spec.keys))
        right = keys_for(rec, spec.right_keys)
        if not keys and not right:
            continue
        fig = new_figure()
        ax = fig.add_subplot()
        for key in keys:
            draw(ax, rec.series[key].finite())
        handles, labels = ax.get_legend_handles_labels()
        if right:
            ax2 = ax.twinx()
            for key in right:
                draw(ax2, rec.series[key].finite(), linestyle="--", color="tab:gray", alpha=0.7)
            ax2.set_ylabel(spec.right_label)
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        if spec.unit_range:
            ax.set_ylim(-0.03, 1.03)
        for y, label in spec.lines:
            ax.axhline(y, color="tab:red", linestyle=":", linewidth=1, alpha=0.6)
            ax.annotate(
                label,
                (0.01, y),
                xycoords=("axes fraction", "data"),
                fontsize=7,
                color="tab:red",
                va="bottom",
                alpha=0.8,
            )
        steps = {int(x) for key in keys + right for x in (rec.series[key].steps[[0, -1]])}
        if len(steps) == 1:  # one logged step (teacher-SFT logs its budget once): centre it
            only = steps.pop()
            ax.set_xlim(only - 1, only + 1)
        integer_steps(ax)
        ax.set_xlabel("step")
        ax.set_ylabel(spec.ylabel)
        ax.set_title(f"{rec.name}: {spec.title}", fontsize=10)
        ax.grid(alpha=0.3)
        if handles:
            ax.legend(handles, labels, fontsize=8, loc="best")
        written.append(save(fig, out_dir / f"{spec.name}.png"))
    return written
