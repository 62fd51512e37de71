"""Helpers for the tests of the evaluation: a Request from loose parts, and a plan's passes run and its
modes' figures scored without a Request (study/evaluation.py's own steps)."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

from omegaconf import OmegaConf

from gru_experiments.models.protocol import LanguageModel
from gru_experiments.models.transformer import TransformerLM
from gru_experiments.report.report import SECTIONS, register_section, unregister_section
from gru_experiments.study.evaluation import (
    DEFAULT_EVALUATION,
    ENTRIES,
    EvaluationSettings,
    plan_for,
    register_entry,
    score_modes,
)
from gru_experiments.study.generation import NO_PROGRESS
from gru_experiments.study.plan import FINAL, Request


def request_of(model, val, seq_len: int, settings=None, training_tokens=None, purpose: str = FINAL, **parts):
    """A Request on `val` (a Split, or a number of targets for a plan alone)."""
    if isinstance(val, int):
        val = SimpleNamespace(n_targets=val)
    if not isinstance(settings, EvaluationSettings):
        settings = EvaluationSettings.of(defaults() | dict(settings or {}), seq_len)
    # the bigram is planned only with the training ids it counts (plan_for): a plan's tests give them to its run
    parts.setdefault("train_ids", TRAINING_IDS_GIVEN_TO_THE_RUN)
    return Request(model, val, settings, training_tokens, purpose, **parts)


TRAINING_IDS_GIVEN_TO_THE_RUN = ()  # not None: the plan has its bigram; run_plan passes the real ids


def defaults() -> dict:
    """conf/evaluation/default.yaml's values (the budget: None, exact), for a test that gives only some."""
    group = OmegaConf.load(DEFAULT_EVALUATION)
    return {**OmegaConf.to_container(group, resolve=False), "budget": None}


def _cfg():
    """A run's config as the cost estimate reads it: 8 x 16 tokens a step, 400 steps an epoch, the evaluation's
    defaults with 4 streams, a budget of 0.01 and a curve to 64."""
    return OmegaConf.create({"data": {"seq_len": 16, "batch_size": 8}, "model": {"steps_per_epoch": 400},
                             "evaluation": defaults() | {"streams": 4, "budget": 0.01, "curve_longest": 64}})


def plan_of(model, val, seq_len: int, settings=None, training_tokens=None, purpose: str = FINAL, **parts):
    return plan_for(request_of(model, val, seq_len, settings, training_tokens, purpose, **parts))


def run_plan(model, train_ids, split, plan, progress=NO_PROGRESS, classes=None):
    """The modes' figures (evaluation.ModeEvaluation) of `plan` on `split`."""
    split = split.to(model.device)
    results = [p.run(SimpleNamespace(model=model, val=split, train_ids=train_ids), progress) for p in plan.passes]
    return score_modes(split, plan, results, None if classes is None else lambda kept: classes)


@contextmanager
def forward_tokens_run(model):
    """A list that collects the forward tokens `model` runs inside the block: the tokens through the
    transformer's blocks (`hidden`, which test_plan holds to its forward_cost), the tokens of every call
    of a family whose forward_cost is a token per token (at the call it implements, forward_features or forward:
    the other runs through it). The plan's counts are checked against it."""
    counted = []
    implements = "forward_features" if type(model).forward is LanguageModel.forward else "forward"
    name = "hidden" if isinstance(model, TransformerLM) else implements
    inner = getattr(model, name)
    setattr(model, name, lambda tokens, *rest: (counted.append(tokens.numel()), inner(tokens, *rest))[1])
    try:
        yield counted
    finally:
        delattr(model, name)


@contextmanager
def registered(entry, section):
    """`entry` appended to evaluation.ENTRIES and `section` to report.SECTIONS inside the block (a figure and its
    report section added from a test file alone), both taken out after it."""
    entries, sections = list(ENTRIES), list(SECTIONS)
    try:  # registered inside: a registration refused (a name taken) takes out only what this block added
        register_entry(entry)
        register_section(section)
        yield
    finally:
        ENTRIES[:] = [known for known in ENTRIES if known is not entry]
        if section in SECTIONS:
            unregister_section(section.name)
    assert ENTRIES == entries and SECTIONS == sections


@contextmanager
def left_out(name: str):
    """The entry `name` taken out of evaluation.ENTRIES inside the block, and put back at its place."""
    at = next(i for i, entry in enumerate(ENTRIES) if entry.name == name)
    entry = ENTRIES.pop(at)
    try:
        yield
    finally:
        ENTRIES.insert(at, entry)
