"""The evaluation's settings, each part a frozen dataclass holding its rules (defaults: conf/evaluation/
default.yaml), built once per run from the checked config; a bad value is one UserError naming the key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gru_experiments.study.text_protocol import TextSettings
from gru_experiments.validation import Rule, check_rules, int_at_least, positive_number, temperature_rule


def _from(cls, node, prefix: str, **more):
    """An instance of dataclass `cls` from its config group `node`, whose keys are those of cls.RULES."""
    check_rules(node, [], prefix, known=[rule.key for rule in cls.RULES])
    return cls(**node, **more)


@dataclass(frozen=True)
class SampleConfig:
    """evaluation.samples: the side-by-side samples, about `chars` characters per prompt at `temperature`."""
    chars: int
    temperature: float
    RULES: ClassVar = [Rule("chars", int_at_least(1), "an integer >= 1"), temperature_rule("temperature")]

    def __post_init__(self):
        check_rules(self.__dict__, self.RULES, "evaluation.samples.")


@dataclass(frozen=True)
class EvaluationSettings:
    """The evaluation group for a model trained on windows of `seq_len` (budget: forward tokens per training
    token, None: exact; window: the windowed mode's, None in the config: seq_len)."""
    seq_len: int
    budget: float | None
    window: int
    streams: int
    curve_longest: int | None
    text: TextSettings
    samples: SampleConfig
    RULES: ClassVar = [
        Rule("streams", int_at_least(1), "an integer >= 1"),
        Rule("window", int_at_least(1), "null (the training data.seq_len) or an integer >= 1", optional=True),
        Rule("budget", positive_number, "null (every figure exact) or a number > 0 (forward tokens per token "
             "trained)", optional=True),
        Rule("curve_longest", int_at_least(1), "null (the curve stops at data.seq_len) or an integer >= 1",
             optional=True),
        *(Rule(part, lambda v: hasattr(v, "keys"), "a mapping") for part in ("text", "samples"))]

    @classmethod
    def of(cls, evaluation, seq_len: int) -> "EvaluationSettings":
        e = evaluation  # a config group, checked
        check_rules(e, cls.RULES, "evaluation.", known=[rule.key for rule in cls.RULES])
        window = int(e["window"] or seq_len)
        return cls(int(seq_len), e["budget"], window, int(e["streams"]), e["curve_longest"],
                   _from(TextSettings, e["text"], "evaluation.text.", window=window),
                   _from(SampleConfig, e["samples"], "evaluation.samples."))
