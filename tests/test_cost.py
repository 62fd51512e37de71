"""What an evaluation costs (study/cost.py): the one line before an evaluation that says what it runs
(describe_plan)."""

from __future__ import annotations

from omegaconf import OmegaConf


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
