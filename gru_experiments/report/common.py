"""The helpers every section of the report writes with: numbers and text ("value ± se", table
cells), markdown tables, and figures (bars with their values, a PNG saved the same way every time)."""

import html
import math
from pathlib import Path

from gru_experiments.files import atomic_file

MISSING = "—"


# --- numbers and text ---------------------------------------------------------------------------------------
def finite(value) -> float | None:
    """A finite number as a float, else None (booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def plus_minus(value: float | None, se: float | None, digits: int = 3, sign: str = "") -> str:
    """"0.937 ± 0.009" ("+0.937 ± 0.009" with sign "+"); the value alone without a standard error, — without a value."""
    if value is None:
        return MISSING
    return f"{value:{sign}.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def cell(value, fmt) -> str:
    return MISSING if value is None else fmt(value)


def figure_cell(job, key: str) -> str:
    """A summary figure ± its standard error (`key`_se; state_gain_bpc's is state_gain_se) to 4 decimals."""
    se = job.number("state_gain_se" if key == "state_gain_bpc" else f"{key}_se")
    return plus_minus(job.number(key), se, 4)


def escape(text: str) -> str:
    """Text safe inside a markdown table cell (line breaks kept as <br>)."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def table(header, rows, align: str) -> list[str]:
    """A markdown table; `align` has a character a column, "l" or "r", the last one repeated."""
    align = align.ljust(len(header), align[-1])
    return (["| " + " | ".join(header) + " |", "|" + "".join("---|" if a == "l" else "--:|" for a in align)]
            + ["| " + " | ".join(row) + " |" for row in rows])


def group_by(items, key) -> dict:
    """{key(item): its items, in their order}, the keys in the order they first come."""
    groups: dict = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups


def ordered(keys, preferred) -> list:
    """`keys` with those of `preferred` first, in its order, then the rest as they came."""
    keys = list(dict.fromkeys(keys))
    return [key for key in preferred if key in keys] + [key for key in keys if key not in preferred]


def image(alt: str, name: str, plots: dict, missing: str) -> str:
    """report.md's line of a plot: the image where it was written, else what is missing."""
    return f"![{alt}]({name})" if name in plots else f"{MISSING} {missing}"


# --- figures ------------------------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, safe in worker processes
    import matplotlib.pyplot as plt

    return plt


def subplots(*args, **kwargs):
    return _pyplot().subplots(*args, **kwargs)


def grouped_bars(ax, series: dict, digits: int = 2, errors: dict | None = None) -> None:
    """A group of bars at each x (0, 1, ...), a bar per series ({label: values}), each labelled with its value
    (a missing value: an empty bar labelled —); `errors` ({label: values}, None where none) draws error bars."""
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(values))]
        spread = [value or 0.0 for value in (errors or {}).get(label) or []]
        bars = ax.bar(xs, [value or 0.0 for value in values], width, label=label, yerr=spread if any(spread) else None,
                      capsize=3 if any(spread) else 0)
        for bar, value in zip(bars, values):
            ax.annotate(MISSING if value is None else f"{value:.{digits}f}", (bar.get_x() + bar.get_width() / 2,
                        bar.get_height()), ha="center", va="bottom", fontsize=7, xytext=(0, 1),
                        textcoords="offset points")


def finish(ax, legend: int, grid: str = "both", **labels) -> None:
    """The axes' titles (`labels`: title, xlabel, ylabel), a light grid and the legend every figure has."""
    ax.set(**labels)
    ax.grid(axis=grid, alpha=0.3)
    ax.legend(fontsize=legend)


def save(fig, path: Path) -> Path:
    """Write the figure as a PNG (atomically) and close it, also when writing fails."""
    # No timestamp in the PNG metadata: the same results give the same bytes.
    try:
        with atomic_file(path) as f:  # a reader (or a second report builder) never sees half a file
            fig.savefig(f, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
        return path
    finally:
        _pyplot().close(fig)
