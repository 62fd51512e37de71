"""Inputs of issue 53 answered with a misleading line or none (item 6): each refused in one line that names the key,
or run with a line that says what runs."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf
from test_reporting import completed, make_job

import sweep as sweep_script
from gru_experiments.errors import UserError
from gru_experiments.models.protocol import build_model
from gru_experiments.report.report import build_report
from gru_experiments.study.generation import Progress


def test_a_truncated_summary_is_named_unreadable_not_still_running(tmp_path):
    sweep = tmp_path / "sweep"
    make_job(sweep, 0, "astra_alpha", summary=completed("astra_alpha", "gru", "char", 2.1))
    job = make_job(sweep, 1, "astra_beta")
    text = json.dumps(completed("astra_beta", "gru", "char", 2.0))
    (job / "summary.json").write_text(text[: len(text) // 2])  # cut off while it was written
    build_report(sweep)
    missing = (sweep / "report.md").read_text().split("## What is missing")[1].split("##")[0]
    assert f"its summary `{job / 'summary.json'}` is unreadable" in missing
    assert "still running" not in missing


def test_sweep_refuses_leviathan_with_experiments_and_takes_a_list_of_sets(compose_config):
    with pytest.raises(UserError, match="^leviathan=true adds Leviathan to models=; experiments= names its own"):
        sweep_script.parse_arguments(["experiments=scale", "leviathan=true"])
    settings, _ = sweep_script.parse_arguments(["experiments=[scale,recall_horizon]"])
    sets = OmegaConf.load(sweep_script.CONF / "sweep.yaml").experiment_sets
    assert list(settings.experiments) == [*sets.scale, *sets.recall_horizon]
    settings, _ = sweep_script.parse_arguments(["models=[beta,astra_alpha]"])
    assert list(settings.models) == ["astra_beta", "transformer_beta", "astra_alpha"]
    with pytest.raises(UserError, match=r"unknown experiment\(s\) \['scale_delta'\]"):
        sweep_script.parse_arguments(["experiments=[scale,scale_delta]"])


def test_an_unknown_architecture_key_names_the_class_without_a_property_object():
    architecture = {"_target_": "gru_experiments.models.minrnn.MinRNNLM", "cell": "mingru", "embedding_dim": 8,
                    "hidden_size": 8, "num_layers": 1, "implementation": "reference"}
    with pytest.raises(UserError) as refused:
        build_model(architecture, 11)
    message = str(refused.value)
    assert "unknown key model.architecture.implementation: MinRNNLM takes" in message and "property" not in message


def test_without_progress_bars_each_pass_says_what_runs(capsys):
    with Progress(enabled=False, lines=True).phase("recall, windowed (1,000 targets)", 7_470_000) as tick:
        tick(10)
    assert capsys.readouterr().out == "evaluation: recall, windowed (1,000 targets), 7,470,000 tokens\n"
    with Progress(enabled=False).phase("stateful", 10):
        pass
    assert capsys.readouterr().out == ""


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
