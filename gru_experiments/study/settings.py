"""The evaluation's settings, each part one frozen dataclass holding its checks: the text statistics
(`evaluation.text`), the side-by-side samples (`evaluation.samples`) and the whole group. Their
defaults are written once, in conf/evaluation/default.yaml. A bad value is one UserError naming the key."""

from __future__ import annotations

from dataclasses import dataclass, fields

from gru_experiments.study.text_index import SPAN
from gru_experiments.validation import Rule, check_rules, int_at_least, is_int, temperature_rule

STRETCH_CHARS = 500  # the drift is measured per stretch of this many characters
# Bounds on the text statistics' size, checked before any work: every sample per mode x decoder is drawn and
# measured (about a second each for Astra-alpha on a CPU at the defaults), so these stay within hours.
MAX_TEXT_SAMPLES = 1_000
MAX_TEXT_CHARS = 100_000  # a sample's characters, and the drift's


def _from(cls, node, prefix: str):
    """An instance of dataclass `cls` from a config node, checked."""
    check_rules(node, cls.RULES, prefix)
    return cls(**{f.name: node[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class TextConfig:
    """evaluation.text: `samples` per mode x decoder (0: no text statistics), of `chars` characters, and
    two generations of `drift_chars` measured stretch by stretch (0: no drift)."""
    samples: int
    chars: int
    drift_chars: int
    RULES = [Rule("samples", lambda v: is_int(v) and 0 <= v <= MAX_TEXT_SAMPLES,
                  f"an integer from 0 (no text statistics) to {MAX_TEXT_SAMPLES:,}", may_be_absent=True),
             Rule("chars", lambda v: is_int(v) and SPAN <= v <= MAX_TEXT_CHARS,
                  f"an integer from {SPAN} (copy_32's span) to {MAX_TEXT_CHARS:,}", may_be_absent=True),
             Rule("drift_chars", lambda v: is_int(v) and (v == 0 or STRETCH_CHARS <= v <= MAX_TEXT_CHARS),
                  f"0 (no drift) or an integer from {STRETCH_CHARS} (one stretch) to {MAX_TEXT_CHARS:,}",
                  may_be_absent=True)]

    @classmethod
    def of(cls, node, prefix: str = "evaluation.text.") -> "TextConfig":
        return _from(cls, node, prefix)


@dataclass(frozen=True)
class SampleConfig:
    """evaluation.samples: the side-by-side samples, about `chars` characters per prompt at `temperature`
    (0: greedy)."""
    chars: int
    temperature: float
    RULES = [Rule("chars", int_at_least(1), "an integer >= 1", may_be_absent=True), temperature_rule("temperature")]

    @classmethod
    def of(cls, node, prefix: str = "evaluation.samples.") -> "SampleConfig":
        return _from(cls, node, prefix)


@dataclass(frozen=True)
class EvaluationSettings:
    """The evaluation group for a model trained on windows of `seq_len`: the budget (forward tokens per
    training token; None: exact), the windowed mode's window (None in the config: seq_len), the stateful
    streams, the curve's longest point, and its two nested parts."""
    seq_len: int
    budget: float | None
    window: int
    streams: int
    curve_longest: int | None
    text: TextConfig
    samples: SampleConfig

    @classmethod
    def of(cls, evaluation, seq_len: int) -> "EvaluationSettings":
        """From an `evaluation` config group (the plan's keys are checked by runs/checks.py)."""
        e = evaluation
        return cls(int(seq_len), e["budget"], int(e["window"] or seq_len), int(e["streams"]), e["curve_longest"],
                   TextConfig.of(e["text"]), SampleConfig.of(e["samples"]))


def check_nested(evaluation) -> None:
    """A one-line UserError for a bad evaluation.text.* or evaluation.samples.* value."""
    TextConfig.of(evaluation["text"])
    SampleConfig.of(evaluation["samples"])
