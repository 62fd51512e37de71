"""What an evaluation costs (study/cost.py): the one line before an evaluation that says what it runs
(describe_plan), the estimated time a run states after its first steps (training + validation + evaluation), and
the evaluation clock's seconds for the cache, which reads the stateful pass without forward tokens of its own."""

from __future__ import annotations

import re

import pytest
from evaluation_helpers import _cfg, plan_of
from omegaconf import OmegaConf
from robustness_helpers import train

from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.study.plan import BEST


def test_the_plans_line_says_what_the_budget_samples_and_the_key_that_scores_everything():
    import torch
    from evaluation_helpers import defaults, plan_of

    from gru_experiments.models.recurrent import RecurrentLM
    from gru_experiments.study.cost import describe_plan
    from gru_experiments.study.evaluation import EvaluationSettings
    from gru_experiments.study.scores import Split

    model = RecurrentLM(11, "gru", embedding_dim=5, hidden_size=8, num_layers=1)
    val = Split(torch.zeros(2001, dtype=torch.long), torch.ones(11, dtype=torch.long))
    for budget, says in ((0.01, "stateful, windowed and the context curve sampled, with their standard errors"),
                         (None, "every figure exact (evaluation.budget=null)")):
        settings = EvaluationSettings.of(OmegaConf.create(defaults() | {"streams": 4, "budget": budget,
                                                                         "curve_longest": 64}), 16)
        plan = plan_of(model, val, 16, settings, training_tokens=100_000)
        line = describe_plan(plan, 100_000, settings)
        assert line.startswith(f"evaluation: {plan.forward_tokens:,} forward tokens (modes ") and says in line, line
        if budget is not None:
            assert line.endswith("(evaluation.budget=null: everything)")


def test_a_run_that_is_not_a_smoke_run_says_so(compose_config, tiny_corpus, capsys):
    cfg = compose_config(f"data.path={tiny_corpus}", "trainer.max_steps=12", "model.steps_per_epoch=12",
                         "data.batch_size=4", "data.seq_len=16", "trainer.enable_progress_bar=false",
                         "trainer.accelerator=cpu", "evaluation.samples.chars=10")
    summary = train(cfg)
    assert summary["smoke"] is False and summary["eval_seconds"] > 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("estimated time left")]
    # Without the progress bar: a line before the evaluation (its forward tokens, what the budget samples), one per pass
    assert f"evaluation: {summary['mode_evaluation']['forward_tokens']:,} forward tokens (modes " in out
    assert "evaluation: stateful, " in out
    # After step 1 (warm-up) and 10 timed steps: one step left, and the evaluation counted.
    assert "training" in line and "(1 steps at" in line and "end-of-run evaluation" in line, line
    # Its forward tokens are those the end-of-run evaluation runs (the final weights' plan; the best checkpoint's
    # only where it is not the final one, said apart)
    counted = int(re.search(r"end-of-run evaluation .*? \(([\d,]+) forward tokens", line).group(1).replace(",", ""))
    assert counted == summary["mode_evaluation"]["forward_tokens"] > 0
    assert "if the best checkpoint is not the final weights" in line


def test_the_estimate_counts_the_cache_which_reads_the_stateful_pass_without_forward_tokens():
    from gru_experiments.study.cost import EvaluationClock

    model = RecurrentLM(11, "gru", embedding_dim=5, hidden_size=8, num_layers=1)
    cfg = _cfg()
    clock = EvaluationClock.of(model, 16)
    final = plan_of(model, 5000, 16, cfg.evaluation, 1000 * 8 * 16)
    best = plan_of(model, 5000, 16, cfg.evaluation, 1000 * 8 * 16, purpose=BEST)
    assert clock.cache_seconds(final) > 0 and clock.cache_seconds(best) == 0  # only the final weights' has one
    assert clock.plan_seconds(final) == pytest.approx(sum(map(clock.pass_seconds, final.passes))
                                                      + clock.cache_seconds(final))
