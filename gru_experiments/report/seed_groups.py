"""Settings: the completed runs of a sweep that differ in their seed alone, one row of the report each, their
figures the means over the trainings with `KEY_sd` beside them (docs/internals.md, *The report over settings*).
"""

from dataclasses import dataclass, field
from statistics import fmean, stdev

from gru_experiments.report.common import finite, group_by
from gru_experiments.report.sweep_folder import JobResult
from gru_experiments.runs.loggers import how_it_ran

# What tells settings apart beside the job's config (which a sweep's job folder records, how it ran removed).
SETTING_KEYS = ("model", "training_mode", "seq_len", "lr", "optim", "probe", "corpus", "tokenizer", "family")


def setting_key(job: JobResult) -> tuple:
    """Everything that tells a run's setting apart: its newest config record and its command line (experiment=...,
    a choice the config does not name) without what says how it ran (loggers.HOW_IT_RAN: the seed, a resume's own
    keys, the device), and the summary's SETTING_KEYS."""
    command = sorted(o for o in job.overrides if not how_it_ran(o.split("=", 1)[0]))
    return (repr(_what_it_trained(job.config or {})), repr(command),
            *(repr(job.values.get(key)) for key in SETTING_KEYS))


def _what_it_trained(config: dict, prefix: str = "") -> list:
    """The config's items, nested ones as lists, sorted, without HOW_IT_RAN's keys."""
    return sorted((key, _what_it_trained(value, f"{prefix}{key}.") if isinstance(value, dict) else value)
                  for key, value in config.items() if not how_it_ran(f"{prefix}{key}"))


def mean_of(values: list):
    """The element-wise mean of records of one shape (numbers, dicts, lists); equal values stay as they are
    (an int stays an int), what is not a number is the first record's."""
    first = values[0]
    if all(value == first for value in values[1:]):
        return first
    if all(finite(value) is not None for value in values):
        return fmean(values)
    if all(isinstance(value, dict) for value in values):
        return {key: mean_of([value[key] for value in values]) for key in first if all(key in v for v in values)}
    if all(isinstance(value, (list, tuple)) and len(value) == len(first) for value in values):
        return type(first)(mean_of(list(column)) for column in zip(*values))
    return first


@dataclass
class Setting(JobResult):
    """A setting of two trainings or more: a JobResult whose values are the means over `runs`."""

    trainings: list = field(default_factory=list)  # its runs, each a JobResult

    @classmethod
    def of(cls, runs: list[JobResult]) -> "Setting":
        first = runs[0]
        values = mean_of([run.values for run in runs])
        for key in first.values:
            points = [finite(run.values.get(key)) for run in runs]
            if None not in points and len({*points}) > 1 and not key.endswith(("_se", "_sd")):
                values[f"{key}_sd"] = stdev(points)
        values.update(seed=None, seeds=[run.values.get("seed") for run in runs])
        history = {metric: mean_of([run.history.get(metric, []) for run in runs]) for metric in first.history}
        return cls(job=first.job, status="completed", values=values, run_dir=first.run_dir, history=history,
                   samples=first.samples, logger=first.logger, config=first.config, overrides=first.overrides,
                   trainings=runs)

    @property
    def runs(self) -> list[JobResult]:
        return self.trainings


def group_settings(jobs: list[JobResult]) -> list[JobResult]:
    """The jobs with each setting's completed runs (distinct known seeds) as one Setting, where its first run was."""
    groups = group_by([job for job in jobs if job.status == "completed" and job.values.get("seed") is not None],
                      setting_key)
    merged = {id(runs[0]): Setting.of(runs) for runs in groups.values()
              if len(runs) > 1 and len({str(run.values["seed"]) for run in runs}) == len(runs)}
    members = {id(run) for setting in merged.values() for run in setting.runs}
    return [merged.get(id(job), job) for job in jobs if id(job) in merged or id(job) not in members]


def spread(job: JobResult, key: str) -> float | None:
    """The between-training standard deviation of a top-level figure (None for a single training)."""
    value = job.values.get(f"{key}_sd") if job.n > 1 else None
    return value if finite(value) is not None else (0.0 if job.n > 1 and job.number(key) is not None else None)

