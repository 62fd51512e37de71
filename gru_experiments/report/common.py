"""What every part of the report shares: the `Section` a part of report.md is (its markdown, its
results.csv columns, its plots, its findings), a `Finding` and the `Findings` a section registers by
claim, and the helpers the sections write with (markdown tables, "value ± se", durations, figures)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gru_experiments.files import atomic_file

MISSING = "—"
RECURRENT = ("gru", "lstm", "rnn")  # the summary's "family" of a model with a carried state


# --- numbers and text ---------------------------------------------------------------------------------------
def finite(value) -> float | None:
    """A finite number as a float, else None (booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def plus_minus(value: float, se: float | None, digits: int = 3) -> str:
    """"0.937 ± 0.009"; the value alone without a standard error."""
    return f"{value:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {seconds % 60:02.0f} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def escape(text: str) -> str:
    """Text safe inside a markdown table cell (line breaks kept as <br>)."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def table(header, rows, align: str) -> list[str]:
    """A markdown table: the header's cells, each row's cells, and `align`'s characters, one a column
    ("l" left, "r" right), the last repeated for the columns it does not reach."""
    align = align.ljust(len(header), align[-1])
    return (["| " + " | ".join(header) + " |", "|" + "".join("---|" if a == "l" else "--:|" for a in align)]
            + ["| " + " | ".join(row) + " |" for row in rows])


def image(alt: str, name: str, plots: dict, missing: str) -> str:
    """report.md's line of a plot: the image where it was written, else what is missing."""
    return f"![{alt}]({name})" if name in plots else f"{MISSING} {missing}"


# --- figures ------------------------------------------------------------------------------------------------
def figure():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, safe in worker processes
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    """Write the figure as a PNG (atomically) and close it, also when writing fails."""
    # No timestamp in the PNG metadata: the same results give the same bytes.
    try:
        with atomic_file(path) as f:  # a reader (or a second report builder) never sees half a file
            fig.savefig(f, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
        return path
    finally:
        figure().close(fig)


# --- findings -----------------------------------------------------------------------------------------------
@dataclass
class Finding:
    """One claim judged by a sweep's numbers; `evidence` states the figures and the rule applied."""

    claim: str
    verdict: str  # supported | partly supported | contradicted | not shown by this sweep | cannot be judged
    evidence: str

    def line(self, number: int) -> str:
        return f"{number}. **{self.claim}**: {self.verdict}. {self.evidence}"


def cannot(missing: str) -> tuple[str, str]:
    """The judgement of a claim that the sweep lacks the figures to judge: what is missing."""
    return "cannot be judged", f"Missing: {missing}."


def verdict(k: int, n: int) -> str:
    """Supported when the claim holds in all n cases, contradicted in none, partly otherwise."""
    return "supported" if k == n else "contradicted" if k == 0 else "partly supported"


@dataclass
class Findings:
    """A heading of report.md's findings and its rules, each registered by its claim (`@group.claim(...)`)
    and returning (verdict, evidence); numbered on from the groups before it."""

    heading: str
    intro: str
    rules: dict[str, Callable] = field(default_factory=dict)  # claim -> rule(jobs), in the report's order

    def claim(self, text: str):
        def register(rule):
            self.rules[text] = rule
            return rule
        return register

    @property
    def claims(self) -> tuple[str, ...]:
        return tuple(self.rules)

    def judge(self, jobs) -> list[Finding]:
        return [Finding(claim, *rule(jobs)) for claim, rule in self.rules.items()]

    def markdown(self, jobs, first: int) -> list[str]:
        lines = [finding.line(i) for i, finding in enumerate(self.judge(jobs), first)]
        return [f"## {self.heading}", "", self.intro, "", *lines]


# --- a section ----------------------------------------------------------------------------------------------
@dataclass
class Section:
    """One part of the report: its lines of report.md (`markdown(jobs, plots)`, [] to leave it out), its
    columns of results.csv ({column: value(job)}), its plots ({file name: plot(jobs, path) -> path or None})
    and its findings. report.py walks the list of them (report.SECTIONS; `register_section`)."""

    name: str
    markdown: Callable[[list, dict], list[str]]
    columns: dict[str, Callable] = field(default_factory=dict)
    plots: dict[str, Callable] = field(default_factory=dict)
    findings: Findings | None = None
    column_rank: int = 0  # results.csv orders the sections' columns by it, then by the sections' order
