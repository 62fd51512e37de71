"""A figure that reads the stateful pass is one entry (issue 61): registered from this file alone, it reads the
logits of every chunk of the stateful pass, as the cache reads its final hidden states, in that pass's own forward:
no forward tokens of its own, no change to the plan's other figures or to the budget's samples; and it reaches
summary.json, W&B (a metric, like every figure of the summary) and the report."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from evaluation_helpers import left_out, plan_of, registered
from omegaconf import OmegaConf
from robustness_helpers import train
from wandb_records import offline_runs

from gru_experiments.data.batches import IGNORE_INDEX
from gru_experiments.data.corpus import SHIPPED_CORPUS, read_corpus, split_text
from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.report.report import build_report
from gru_experiments.report.section import Section
from gru_experiments.runs.task import load_checkpoint
from gru_experiments.study.plan import FINAL, Entry
from gru_experiments.study.scores import Split

TOP = 5
TIMINGS = ("tokens_per_second", "train_seconds", "wall_seconds", "eval_seconds", "seconds", "run_dir", "checkpoint",
           "best_checkpoint")


class TopFiveEntry(Entry):
    """The share of the stateful pass's targets among the model's five likeliest tokens, from its logits."""
    name = "top5"

    def reads_stateful(self, request):
        return request.purpose == FINAL

    def read(self, chunk):  # every chunk of the stateful pass: (targets among the top five, targets)
        scored = chunk.targets != IGNORE_INDEX
        top = chunk.logits.topk(TOP, dim=-1).indices == chunk.targets.unsqueeze(-1)
        return int((top.any(-1) & scored).sum()), int(scored.sum())

    def run(self, request, plan, results):
        if results is None:  # a finite-context model's sampled stateful figure runs windows: no chunks to read
            return None
        hits, targets = (sum(column) for column in zip(*results))
        return hits / targets

    def summary(self, result):
        return {"top5_accuracy": result}

    def describe(self, result):
        return f"top-{TOP} accuracy of the stateful pass: {result:.4f}"


# Its report section: a line per run, and a column of results.csv.
SECTION = Section("top5", lambda jobs, plots: ["## Top five", "", *(
    f"- {job.model}: {job.number('top5_accuracy'):.4f} of the targets in the top five" for job in jobs), ""],
    columns={"top5_accuracy": lambda job: job.values["top5_accuracy"]})


@pytest.fixture
def top_five():
    """The entry and its section registered for one test, and taken out after it."""
    with registered(TopFiveEntry(), SECTION):
        yield


def test_reading_the_stateful_pass_leaves_the_budget_s_plan_as_it_was(compose_config, top_five):
    """Astra-alpha's full recipe at the default budget (tests/test_plan.py's case): with the entry, every figure,
    pass, stride and forward token of the plan is the same; the stateful pass is read by the cache and by it."""
    cfg = compose_config()
    text = read_corpus(SHIPPED_CORPUS)
    tokenizer = CharTokenizer.from_text(text)
    val = Split.of(torch.tensor(tokenizer.encode(split_text(text, 0.9)[1])), tokenizer)
    model = RecurrentLM(65, "gru", embedding_dim=64, hidden_size=128, num_layers=1)

    def plan():
        return plan_of(model, val, 128, cfg.evaluation, training_tokens=2000 * 64 * 128, tokenizer=tokenizer,
                       seed=cfg.seed)
    read = plan()
    with left_out("top5"):
        alone = plan()
    assert read.record() == alone.record() and read.forward_tokens == alone.forward_tokens
    assert [(p.kind, p.stride, p.targets, p.forward_tokens) for p in read.passes] == [
        (p.kind, p.stride, p.targets, p.forward_tokens) for p in alone.passes]
    readers = [reader.name for reader in read.passes[read.figure("stateful").passes[0]].readers]
    alone_readers = [reader.name for reader in alone.passes[alone.figure("stateful").passes[0]].readers]
    assert readers == [*alone_readers, "top5"]  # one reader more, whatever else is registered


def _figures(summary: dict) -> dict:
    """summary.json without its timings, paths and the entry's own figure."""
    best = {k: v for k, v in summary["best"].items() if k != "checkpoint"}
    return {k: v for k, v in summary.items() if k not in (*TIMINGS, "top5_accuracy")} | {"best": best}


def test_a_figure_that_reads_the_stateful_logits_reaches_every_output(compose_config, tiny_corpus, tmp_path, top_five,
                                                                      monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    overrides = (f"data.path={tiny_corpus}", "trainer.max_steps=3", "model.epochs=1", "model.steps_per_epoch=3",
                 "data.batch_size=4", "data.seq_len=16", "trainer.enable_progress_bar=false", "trainer.accelerator=cpu",
                 "evaluation.text.samples=0", "evaluation.samples.chars=10", "evaluation.streams=1")
    sweep = tmp_path / "sweep"
    cfg = compose_config(*overrides, "logger=wandb", f"paths.output_dir={sweep / '0_astra_alpha'}")
    summary = train(cfg)
    on_disk = json.loads((sweep / "0_astra_alpha" / "summary.json").read_text())
    assert "top-5 accuracy of the stateful pass" in capsys.readouterr().out
    # The figure, against the model's own stateful pass over the split (one stream, chunks of seq_len).
    task = load_checkpoint(on_disk["checkpoint"])
    model = task.model.eval()
    _, val_text = split_text(tiny_corpus.read_text(encoding="utf-8"), cfg.data.train_fraction)
    ids = torch.tensor(task.tokenizer.encode(val_text))
    hits, state = 0, None
    with torch.no_grad():
        for start in range(0, ids.numel() - 1, 16):
            chunk = ids[start:min(start + 16, ids.numel() - 1)]
            logits, state = model(chunk[None], state)
            hits += int((logits[0].topk(TOP, dim=-1).indices == ids[start + 1:start + 1 + chunk.numel(), None]).sum())
    assert on_disk["top5_accuracy"] == summary["top5_accuracy"] == pytest.approx(hits / (ids.numel() - 1), abs=1e-12)
    # At no forward tokens of its own, leaving every other figure as it was (the same training without it).
    with left_out("top5"):
        train(compose_config(*overrides, f"paths.output_dir={tmp_path / 'alone'}"))
    alone = json.loads((tmp_path / "alone" / "summary.json").read_text())
    assert "top5_accuracy" not in alone
    assert on_disk["mode_evaluation"]["forward_tokens"] == alone["mode_evaluation"]["forward_tokens"]
    assert _figures(on_disk) == _figures(alone)
    # W&B: a metric, as every number of the evaluation's summary (loggers.figure_metrics), and in the run's summary.
    [run] = offline_runs(sweep / "0_astra_alpha")
    assert run.series("top5_accuracy") == [pytest.approx(on_disk["top5_accuracy"])]
    assert run.summary["top5_accuracy"] == pytest.approx(on_disk["top5_accuracy"])
    longest = str(on_disk["cache"]["longest"])
    for key, value in {"cache_gain_bpc": on_disk["cache_gain_bpc"], "modes/stateful_bpc": on_disk["stateful_bpc"],
                       f"cache/by_size/{longest}/gain_bpc": on_disk["cache"]["by_size"][longest]["gain_bpc"],
                       "context_curve/1": on_disk["context_curve"]["1"]}.items():
        assert run.series(key) == [pytest.approx(value)], key
    assert math.isfinite(on_disk["cache_gain_bpc"])
    # The report: its results.csv column and its section.
    (sweep / "0_astra_alpha" / ".hydra").mkdir()
    OmegaConf.save(cfg, sweep / "0_astra_alpha" / ".hydra" / "config.yaml")
    OmegaConf.save({"hydra": {"job": {"num": 0}}}, sweep / "0_astra_alpha" / ".hydra" / "hydra.yaml")
    built = build_report(sweep)
    rows = list(csv.DictReader(Path(built.files["results.csv"]).open()))
    assert float(rows[0]["top5_accuracy"]) == pytest.approx(on_disk["top5_accuracy"])
    assert (f"## Top five\n\n- astra_alpha: {on_disk['top5_accuracy']:.4f} of the targets in the top five\n"
            in Path(built.files["report.md"]).read_text())
