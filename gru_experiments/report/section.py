"""The shape every part of the report has: a `Section` (its lines of report.md, its columns of results.csv,
its plots, its findings), the `Findings` it registers by claim, each judged into a `Finding`, and the
record it reads from a summary with the jobs that have it. report.py walks the list of sections."""

from dataclasses import dataclass, field
from typing import Callable

from gru_experiments.report.significance import recording, rests_on


# --- findings -----------------------------------------------------------------------------------------------
@dataclass
class Finding:
    """One claim judged by a sweep's numbers; `evidence` states the figures and the rule applied."""

    claim: str
    verdict: str  # supported | partly supported | contradicted | not shown by this sweep | cannot be judged
    evidence: str


def cannot(missing: str) -> tuple[str, str]:
    """The judgement of a claim that the sweep lacks the figures to judge: what is missing."""
    return "cannot be judged", f"Missing: {missing}."


def verdict(k: int, n: int, against: int | None = None) -> str:
    """Supported when the claim holds in all n cases, partly in some; in none, contradicted, or, where `against`
    counts the cases that contradict it, contradicted only when all do (else not shown by this sweep)."""
    return ("supported" if k == n else "partly supported" if k else
            "contradicted" if against in (None, n) else "not shown by this sweep")


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

    def judge(self, jobs) -> list[Finding]:
        """Each claim judged by its rule, its evidence ending with how many trainings it rests on."""
        found = []
        for claim, rule in self.rules.items():
            with recording() as used:
                judged, evidence = rule(jobs)
            basis = "" if judged == "cannot be judged" else rests_on(used, jobs)
            found.append(Finding(claim, judged, f"{evidence} {basis}".rstrip()))
        return found

    def markdown(self, jobs, first: int) -> list[str]:
        lines = [f"{i}. **{f.claim}**: {f.verdict}. {f.evidence}" for i, f in enumerate(self.judge(jobs), first)]
        return [f"## {self.heading}", "", self.intro, "", *lines]


# --- a section ----------------------------------------------------------------------------------------------
@dataclass
class Section:
    """One part of the report: its lines of report.md ([] to leave it out), its columns of results.csv
    ({column: value(job)}), its plots ({file name: plot(jobs, path) -> path or None}) and its findings."""

    name: str
    markdown: Callable[[list, dict], list[str]]
    columns: dict[str, Callable] = field(default_factory=dict)
    plots: dict[str, Callable] = field(default_factory=dict)
    findings: Findings | None = None
    column_rank: int = 0  # results.csv orders the sections' columns by it, then by the sections' order


# --- the record a section reads ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    """The summary's record a section reads: record(job) is the non-empty dict at `path`, holding a dict under
    `holding` where given, else None; record.jobs(jobs) the completed jobs that have it, in launch order."""

    path: tuple[str, ...]
    holding: str | None = None

    def __call__(self, job) -> dict | None:
        found = job.values
        for key in self.path:
            found = found.get(key) if isinstance(found, dict) else None
        if not isinstance(found, dict) or not found or (self.holding and not isinstance(found.get(self.holding), dict)):
            return None
        return found

    def jobs(self, jobs) -> list:
        return [job for job in jobs if getattr(job, "status", "completed") == "completed" and self(job)]
