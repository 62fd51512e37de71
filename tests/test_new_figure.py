"""A new figure is one entry (issue 35): a pass and a report section registered from this file alone,
with no change to any package file, reach summary.json, the cost estimate, results.csv and report.md."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from evaluation_helpers import defaults, left_out, registered
from omegaconf import OmegaConf
from robustness_helpers import train

from gru_experiments.data.corpus import split_text
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.report.report import build_report
from gru_experiments.report.section import Section
from gru_experiments.runs.trained_run import TrainedRun
from gru_experiments.runs.training_callbacks import CostEstimate
from gru_experiments.study.evaluation import ENTRIES, EvaluationSettings
from gru_experiments.study.plan import FINAL, OTHER, Entry, Figure, Pass, Unit
from gru_experiments.study.scores import Split

COST = 1_234  # the demonstration pass's forward tokens, as its plan counts them


@dataclass(frozen=True)
class RepeatsPass(Pass):
    """How many targets repeat the token before them: no model needed, COST forward tokens planned."""
    kind: ClassVar[str] = "repeats"

    def run(self, request, progress=None) -> dict:
        ids = request.val.ids
        return {None: int((ids[1:] == ids[:-1]).sum())}


class RepeatsEntry(Entry):
    name = "repeats"

    def units(self, request):
        if request.purpose != FINAL:
            return []
        repeats = RepeatsPass(request.val.n_targets, COST)
        return [Unit(lambda stride: [repeats], lambda ps, i: [Figure("repeats", 1, 0, ps[0].targets, COST, (i,),
                                                                      OTHER)], True, owner=self.name)]

    def summary(self, result):
        return {"repeats": result}

    def describe(self, result):
        return f"targets that repeat their previous token: {result:,}"


@pytest.fixture
def repeats():
    """The entry and its section registered for one test, and taken out after it."""
    with registered(RepeatsEntry(), Section("repeats", lambda jobs, plots: ["## Repeats", "", *(
            f"- {job.model}: {job.number('repeats'):,.0f} repeated targets" for job in jobs), ""],
            columns={"repeats": lambda job: job.values["repeats"]})):
        yield


def test_a_registered_pass_and_section_reach_every_output(compose_config, tiny_corpus, tmp_path, repeats, capsys):
    sweep = tmp_path / "sweep"
    cfg = compose_config(f"data.path={tiny_corpus}", "trainer.max_steps=3", "model.epochs=1", "model.steps_per_epoch=3",
                         "data.batch_size=4", "data.seq_len=16", "trainer.enable_progress_bar=false",
                         "trainer.accelerator=cpu", "evaluation.text.samples=0", "evaluation.samples.chars=10",
                         f"paths.output_dir={sweep / '0_astra_alpha'}")
    summary = train(cfg)
    on_disk = json.loads((sweep / "0_astra_alpha" / "summary.json").read_text())
    _, val_text = split_text(tiny_corpus.read_text(encoding="utf-8"), cfg.data.train_fraction)
    repeated = sum(a == b for a, b in zip(val_text, val_text[1:]))  # characters: a char model's targets
    assert on_disk["repeats"] == summary["repeats"] == repeated > 0
    assert "targets that repeat their previous token" in capsys.readouterr().out
    assert {"name": "repeats", "context": 1, "cost": 0, "targets": on_disk["mode_evaluation"]["split_targets"],
            "forward_tokens": COST} in on_disk["mode_evaluation"]["plan"]
    # The cost estimate counts its forward tokens (the final weights' evaluation only).
    val = Split(torch.zeros(1001, dtype=torch.long), torch.ones(11, dtype=torch.long))
    estimate_cfg = OmegaConf.create({"data": {"seq_len": 16, "batch_size": 8}, "model": {"steps_per_epoch": 400},
                                     "evaluation": defaults() | {"streams": 4, "budget": 0.01,
                                                                    "curve_longest": 64}, "seed": 0})
    model = RecurrentLM(11, "gru", embedding_dim=5, hidden_size=8, num_layers=1)
    settings = EvaluationSettings.of(estimate_cfg.evaluation, estimate_cfg.data.seq_len)
    def estimate():
        return CostEstimate(TrainedRun(model, None, "model"), val, settings, tokens_per_step=8 * 16,
                            epoch_tokens=400 * 8 * 16)

    with_entry = estimate().plans(1000)[0].forward_tokens
    with left_out("repeats"):
        without = estimate().plans(1000)[0].forward_tokens
    assert with_entry - without == COST
    # The report: a sweep folder of that one job.
    (sweep / "0_astra_alpha" / ".hydra").mkdir()
    OmegaConf.save(cfg, sweep / "0_astra_alpha" / ".hydra" / "config.yaml")
    OmegaConf.save({"hydra": {"job": {"num": 0}}}, sweep / "0_astra_alpha" / ".hydra" / "hydra.yaml")
    built = build_report(sweep)
    rows = list(csv.DictReader(Path(built.files["results.csv"]).open()))
    assert int(rows[0]["repeats"]) == on_disk["repeats"]
    assert f"## Repeats\n\n- astra_alpha: {on_disk['repeats']:,} repeated targets\n" in Path(
        built.files["report.md"]).read_text()


def test_a_figure_name_taken_is_refused_and_leaks_nothing(repeats):
    """A second entry of a registered name is refused (its results and summary are keyed by it), and the failed
    registration takes out only what it added: the first stays, and no other test sees the second."""
    entries = list(ENTRIES)
    with pytest.raises(ValueError, match="'repeats': the name is taken"):
        with registered(RepeatsEntry(), Section("repeats again", lambda jobs, plots: [])):
            pytest.fail("the block ran with a name taken")
    assert ENTRIES == entries and [entry.name for entry in ENTRIES].count("repeats") == 1
