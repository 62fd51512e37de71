"""Resume inputs of issue 53: a run folder is trained in by one process at a time, and a resume takes what the run
was trained with from the run itself (its saved config, checked against its checkpoint's record, or that record where
the config is missing or damaged), or refuses in one line; never today's defaults."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from robustness_helpers import (
    TINY,
    Interrupted,
    assert_untouched,
    error_line,
    fingerprint,
    interrupt_at,
    run_killed_after_checkpoint,
    run_script,
    start_script,
)

from gru_experiments.errors import UserError
from gru_experiments.runs.resume import ResumePoint, saved_config
from gru_experiments.runs.run_dir import RunDir
from gru_experiments.runs.training import train

# 6 steps at batch 4 (not today's default), last.ckpt every 2: killed right after the checkpoint of step 2.
STEPS = 6
RECIPE = [*TINY, "data.batch_size=4", "data.seq_len=16", f"model.steps_per_epoch={STEPS}", "model.epochs=1",
          "checkpoint.every_n_steps=2"]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, tiny_corpus) -> Path:
    """A run killed after its checkpoint of step 2: its folder (copy it before changing it)."""
    root = tmp_path_factory.mktemp("interrupted")
    result = run_killed_after_checkpoint(root, 2, *RECIPE, f"data.path={tiny_corpus}")
    assert result.returncode != 0, result.stderr
    (run,) = (root / "outputs" / "runs" / "astra_alpha").iterdir()
    return run


def copy_of(run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(root, run): a copy of the run under a fresh PROJECT_ROOT."""
    root = tmp_path / "root"
    copy = root / "outputs" / "runs" / "astra_alpha" / run.name
    shutil.copytree(run, copy)
    return root, copy


def history_rows(run: Path) -> list[tuple[str, str]]:
    """(step, metric) of each row of history.csv, in order (a figure written twice shows twice)."""
    lines = (run / "history.csv").read_text().splitlines()
    step, metric = (lines[0].split(",").index(name) for name in ("step", "metric"))
    return [(line.split(",")[step], line.split(",")[metric]) for line in lines[1:]]


@pytest.mark.slow
def test_a_second_process_in_a_running_run_is_refused_in_one_line(interrupted, tmp_path):
    """A run folder is trained in by one process at a time (RunDir.hold): a resume of a run that another process holds
    is refused in one line and changes nothing; two resumes started together leave the files one resume leaves."""
    root, run = copy_of(interrupted, tmp_path)
    with RunDir(run).hold():  # as a running train.py holds it
        before = fingerprint(run)
        result = run_script(root, f"resume={run}")
        assert result.returncode == 2
        assert "is in use: another process is training in it" in error_line(result.stderr)
        assert_untouched(before, fingerprint(run))
    first, second = start_script(root, f"resume={run}"), (time.sleep(0.5), start_script(root, f"resume={run}"))[1]
    outputs = [process.communicate(timeout=300) for process in (first, second)]
    codes = sorted(process.returncode for process in (first, second))
    assert codes == [0, 2], outputs
    refused = outputs[[first.returncode, second.returncode].index(2)][1]
    assert "is in use" in error_line(refused) or "finished" in error_line(refused)
    assert len(list((run / ".hydra").glob("resumed_*"))) == 1  # one resume's record
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["train_steps"], summary["resumed_from_step"]) == (STEPS, 2)
    rows = history_rows(run)
    assert len(rows) == len(set(rows)), rows  # no figure written twice


@pytest.mark.slow
def test_a_resume_without_its_saved_config_takes_the_checkpoints_record(interrupted, tmp_path, tiny_corpus):
    """.hydra/ gone, or config.yaml cut off after model.architecture: the resume trains on with the run's own batch size
    and steps (the config its checkpoint recorded), saying so in a line; not with today's defaults."""
    for damage in ("gone", "cut off"):
        root, run = copy_of(interrupted, tmp_path / damage.replace(" ", "_"))
        config = run / ".hydra" / "config.yaml"
        if damage == "gone":
            shutil.rmtree(run / ".hydra")
        else:
            text = config.read_text()
            config.write_text(text[:text.index("\n", text.index("architecture:") + 1)])
        result = run_script(root, f"resume={run}")
        assert result.returncode == 0, result.stderr
        assert "resuming with the config that checkpoint" in result.stdout
        assert ("is missing" if damage == "gone" else "is damaged (cut off: it lacks") in result.stdout
        summary = json.loads((run / "summary.json").read_text())
        assert (summary["train_steps"], summary["corpus"]) == (STEPS, str(tiny_corpus))
        assert summary["train_tokens"] == STEPS * 4 * 16  # the run's batch size, not today's 64
        record = OmegaConf.load(next((run / ".hydra").glob("resumed_*/config.yaml")))
        assert (record.data.batch_size, record.logger) == (4, {})  # logger=none: what later resumes inherit


@pytest.mark.slow
def test_a_resume_refuses_what_the_run_itself_cannot_tell(interrupted, tmp_path, tiny_corpus):
    """An edited config.yaml, an old checkpoint without the record and no config, another corpus, and ckpt_path naming
    another run than resume: each refused in one line that names the key, the run folder left as it was."""
    root, run = copy_of(interrupted, tmp_path)
    config = run / ".hydra" / "config.yaml"
    point = ResumePoint.read(RunDir(run))
    text = config.read_text()
    config.write_text(text.replace("batch_size: 4", "batch_size: 64", 1))
    with pytest.raises(UserError, match=r"config.yaml says data.batch_size=64, but checkpoint .* was trained with "
                                        r"data.batch_size=4: the saved config was edited since"):
        saved_config(RunDir(run), point)
    config.write_text(text)
    old = ResumePoint(**{**point.__dict__, "run_config": None})  # a checkpoint from before the record
    config.rename(config.with_suffix(".gone"))
    with pytest.raises(UserError, match="is missing, and checkpoint .* is from before checkpoints recorded their "
                                        "config: .* never takes today's defaults"):
        saved_config(RunDir(run), old)
    config.with_suffix(".gone").rename(config)
    assert saved_config(RunDir(run), old).data.batch_size == 4  # the saved config alone, as before

    other = tmp_path / "other.txt"
    other.write_text(tiny_corpus.read_text()[::-1])
    # another learning rate in the saved config: not blamed on the command, which names none
    config.write_text(text.replace("lr: 0.01", "lr: 0.02", 1))
    before = fingerprint(run)
    for overrides, refused in (
            ([], "asks for model.lr=0.02; a run resumes with its own learning rate and recipe: the command does not "
                 "name model.lr, so the run's saved config"),
            ([f"data.path={other}"], f"was trained with data.path='{tiny_corpus}', but this command asks for "
                                     f"data.path='{other}'"),
            ([f"ckpt_path={tmp_path}"], f"resume={run} and ckpt_path={tmp_path} name two runs")):
        if overrides:
            config.write_text(text)
            before = fingerprint(run)
        result = run_script(root, f"resume={run}", *overrides)
        assert result.returncode == 2 and refused in error_line(result.stderr), result.stderr
        assert_untouched(before, fingerprint(run))


def test_the_checkpoint_records_the_runs_config(interrupted):
    """What saved_config falls back on: the config of the part that wrote the checkpoint, read without running code."""
    saved = torch.load(interrupted / "checkpoints" / "last.ckpt", weights_only=True, mmap=True)
    assert saved["run_config"]["data"]["batch_size"] == 4 and not saved["run_config"]["logger"]  # logger=none


# --- issue 62: nothing lost -------------------------------------------------------------------------------------------

def test_a_resume_applies_every_override_it_takes_null_included(compose_config):
    """`key=null` on a resume is applied like any other value (it was dropped: `evaluation.budget=null` scored at the
    run's budget, `early_stopping.patience=null` kept the run's patience); a group chosen alike keeps the run's keys."""
    from gru_experiments.runs.resume import resumed_config

    saved = compose_config(*TINY, "evaluation.budget=0.05", "early_stopping.patience=50", "evaluation.curve_longest=64")
    overrides = ["resume=RUN", "evaluation.budget=null", "early_stopping.patience=null",
                 "evaluation.curve_longest=null", "evaluation=default"]
    chosen = {"evaluation": "default", "early_stopping": "default", "model": "astra_alpha", "logger": "none"}
    cfg = resumed_config(saved, compose_config(*overrides), overrides, chosen, chosen)
    assert (cfg.evaluation.budget, cfg.early_stopping.patience, cfg.evaluation.curve_longest) == (None, None, None)
    assert cfg.evaluation.streams == saved.evaluation.streams and cfg.model.lr == saved.model.lr


@pytest.mark.slow
def test_a_resume_with_evaluation_budget_null_scores_everything(interrupted, tmp_path):
    root, run = copy_of(interrupted, tmp_path)
    result = run_script(root, f"resume={run}", "evaluation.budget=null", "evaluation.curve_longest=null",
                        "evaluation.text.samples=0")
    assert result.returncode == 0, result.stderr
    assert "every figure exact (evaluation.budget=null)" in result.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["mode_evaluation"]["budget"] is None and summary["mode_evaluation"]["windowed_stride"] == 1
    record = OmegaConf.load(next((run / ".hydra").glob("resumed_*/config.yaml")))
    assert (record.evaluation.budget, record.evaluation.curve_longest) == (None, None)


def test_a_resume_refuses_a_corpus_that_changed_since(compose_config, tiny_corpus, tmp_path, monkeypatch):
    """The checkpoint and summary.json record the corpus's sha256; a resume on another text (the run's data.path
    edited since) is refused in one line before any work, the run folder as it was; on the same text it resumes."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(tiny_corpus.read_bytes())
    sha256 = hashlib.sha256(corpus.read_bytes()).hexdigest()
    config = [*RECIPE, f"data.path={corpus}", f"paths.output_dir={tmp_path / 'run'}"]
    interrupt_at(monkeypatch, 3)
    with pytest.raises(Interrupted):
        train(compose_config(*config))
    monkeypatch.undo()
    run = tmp_path / "run"
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, mmap=True)["corpus_sha256"] == sha256
    corpus.write_text(corpus.read_text().replace("gato", "gata"))  # the same characters: the vocabulary alike
    before = fingerprint(run)
    with pytest.raises(UserError, match=f"the corpus changed since run {run} trained on it: {corpus} has sha256 "
                                        f"[0-9a-f]{{64}}, but checkpoint .* was trained on sha256 {sha256}; a resume "
                                        "continues on the run's own corpus: restore that text"):
        train(compose_config(*config, f"resume={run}"))
    assert_untouched(before, fingerprint(run))
    corpus.write_bytes(tiny_corpus.read_bytes())
    assert train(compose_config(*config, f"resume={run}"))["corpus_sha256"] == sha256
    assert json.loads((run / "summary.json").read_text())["corpus_sha256"] == sha256


DAMAGES = {"a weight": ("state_dict", "model.head.bias"), "Lightning's version": ("pytorch-lightning_version",)}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.slow
def test_a_checkpoint_without_a_weight_or_lightnings_version_is_refused_in_one_line(interrupted, tmp_path, damage):
    """Refused before anything is written (no .hydra/resumed_* record), not a traceback from inside Lightning's load."""
    root, run = copy_of(interrupted, tmp_path)
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    *parents, key = DAMAGES[damage]
    del (checkpoint[parents[0]] if parents else checkpoint)[key]
    torch.save(checkpoint, run / "checkpoints" / "last.ckpt")
    before = fingerprint(run)
    result = run_script(root, f"resume={run}")
    assert result.returncode == 2, result.stderr
    assert (f"is not a gru-experiments training checkpoint (it lacks {key})" if not parents else
            f"is damaged: it lacks the weights {key}; it cannot be resumed") in error_line(result.stderr)
    assert_untouched(before, fingerprint(run))
    assert not list((run / ".hydra").glob("resumed_*"))
