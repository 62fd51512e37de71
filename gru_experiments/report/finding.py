"""A finding of report.md: a claim, its verdict and the measured figures it rests on; and the small
helpers every judging module shares (findings.py, recall_findings.py, text_findings.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

RECURRENT = ("gru", "lstm", "rnn")  # the summary's "family" of a model with a carried state


@dataclass
class Finding:
    """One claim judged by a sweep's numbers; `evidence` states the figures and the rule applied."""

    claim: str
    verdict: str  # supported | partly supported | contradicted | not shown by this sweep | cannot be judged
    evidence: str

    def line(self, number: int) -> str:
        return f"{number}. **{self.claim}**: {self.verdict}. {self.evidence}"


def cannot(claim: str, missing: str) -> Finding:
    """The finding of a claim that the sweep lacks the figures to judge: what is missing."""
    return Finding(claim, "cannot be judged", f"Missing: {missing}.")


def verdict(k: int, n: int) -> str:
    """Supported when the claim holds in all n cases, contradicted in none, partly otherwise."""
    return "supported" if k == n else "contradicted" if k == 0 else "partly supported"


def finite(value) -> float | None:
    """A finite number as a float, else None (booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def plus_minus(value: float, se: float | None, digits: int = 3) -> str:
    """"0.937 ± 0.009"; the value alone without a standard error."""
    return f"{value:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def numbered(findings: list[Finding], first: int) -> list[str]:
    """report.md's lines of the findings, numbered from `first`."""
    return [finding.line(i) for i, finding in enumerate(findings, first)]
