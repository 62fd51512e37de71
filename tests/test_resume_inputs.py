"""Resume inputs of issue 53: a run folder is trained in by one process at a time, and a resume takes what the run
was trained with from the run itself (its saved config, checked against its checkpoint's record, or that record where
the config is missing or damaged), or refuses in one line; never today's defaults."""

from __future__ import annotations

import hashlib
import json
import re
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
    train,
)

from gru_experiments.errors import UserError
from gru_experiments.runs.resume import ResumePoint, saved_config
from gru_experiments.runs.run_dir import RunDir

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
            ([f"data.path={other}"], f"the corpus changed since run {run} trained on it: {other} has sha256 "),
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


# --- the checks of a resume without a training (the trainings above that reach them are slow) ------------------------

def point_of(run: Path, cfg, **fields) -> ResumePoint:
    """What ResumePoint.read makes of a char-tokenized run's checkpoint at step 4, trained with `cfg`'s learning rate
    and recipe, without a checkpoint file."""
    from gru_experiments.data.tokenizers import CharTokenizer

    tokenizer = CharTokenizer.from_text("abc \n")
    return ResumePoint(**{
        "run": RunDir(run), "checkpoint": run / "checkpoints" / "last.ckpt", "step": 4, "wandb_run_id": None,
        "hyper_parameters": {"vocab_size": tokenizer.vocab_size, "architecture": {"_target_": "m", "width": 8},
                             "lr": cfg.model.lr, "optim": OmegaConf.to_container(cfg.optim)},
        "tokenizer": tokenizer.state_dict(), "weights": {"head.weight": (5, 8), "head.bias": (5,)}, **fields})


def test_a_checkpoint_that_lacks_a_weight_of_the_model_is_refused_before_lightning_loads_it(compose_config, tmp_path):
    from gru_experiments.data.tokenizers import CharTokenizer

    point = point_of(tmp_path, compose_config(*TINY))
    tokenizer, hyper_parameters = CharTokenizer.from_text("abc \n"), {"architecture": {"_target_": "m", "width": 8}}
    point.check(hyper_parameters, tokenizer, {"head.weight": (5, 8), "head.bias": (5,)})  # the model's own weights
    with pytest.raises(UserError, match=re.escape(
            f"checkpoint {point.checkpoint} is damaged: it lacks the weights embed.weight; it holds head.weight "
            "[5, 8] (the model's: [5, 16]); it cannot be resumed")):
        point.check(hyper_parameters, tokenizer, {"head.weight": (5, 16), "head.bias": (5,), "embed.weight": (5, 16)})


def test_a_step_limit_at_or_below_the_checkpoints_step_is_refused(compose_config, tmp_path):
    """A limit that would train nothing is refused, naming the run's own limit; one at the checkpoint's step of a run
    whose training was complete (killed in its evaluation) is taken: the resume finishes that."""
    from gru_experiments.runs.resume import step_limit

    cfg = compose_config(*TINY, "trainer.max_steps=3")
    with pytest.raises(UserError, match=re.escape(
            "is at step 4, but this resume would stop training at step 3 (trainer.max_steps, or model.epochs x "
            "model.steps_per_epoch): it would train nothing and the run would count as finished; its own limit is "
            "step 6; resume with a step limit above 4, or without one")):
        point_of(tmp_path, cfg, planned_steps=6).check_config(cfg)
    point_of(tmp_path, cfg, step=3, planned_steps=3).check_config(cfg)  # complete: its evaluation is what is left
    assert step_limit(cfg) == 3
    assert step_limit(compose_config(*TINY, "trainer.max_steps=3", "trainer.fast_dev_run=true")) is None


def interrupted_folder(tmp_path: Path) -> Path:
    """A run folder as a kill leaves it: a last checkpoint (its content unread here), no summary."""
    run = tmp_path / "outputs" / "runs" / "astra_alpha" / "2000-01-01_00-00-00_000000"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"checkpoint")
    return run


def test_resume_run_refuses_a_multirun_and_two_runs_named(compose_config, tmp_path, monkeypatch):
    from gru_experiments.runs import jobs
    from gru_experiments.runs.resume import resume_run

    run = interrupted_folder(tmp_path)
    with pytest.raises(UserError, match=f"resume={run} and ckpt_path={tmp_path} name two runs .*: give one of them"):
        resume_run(compose_config(*TINY, f"resume={run}", f"ckpt_path={tmp_path}"))
    monkeypatch.setattr(jobs, "multirun_job", lambda: True)
    with pytest.raises(UserError, match=r"^resume continues a single run; drop -m/--multirun$"):
        resume_run(compose_config(*TINY, f"resume={run}"))


def test_a_run_that_finished_while_the_resume_waited_for_its_lock_is_refused(compose_config, tmp_path, monkeypatch):
    """The process that held the folder finished the run meanwhile (a stand-in for its lock writes the summary)."""
    from contextlib import ExitStack, contextmanager

    from gru_experiments.runs.resume import resume_run

    run = interrupted_folder(tmp_path)

    @contextmanager
    def held_until_finished(self, what):
        self.write_summary({"status": "completed"})
        yield self

    monkeypatch.setattr(RunDir, "hold", held_until_finished)
    with ExitStack() as held, pytest.raises(UserError, match=re.escape(
            f"run {run} finished while this command waited for it (it has a summary.json): nothing to resume")):
        resume_run(compose_config(*TINY, f"resume={run}"), held)


def test_a_resume_removes_the_temporary_files_of_a_save_cut_short(compose_config, tmp_path, monkeypatch, capsys):
    """Without Hydra (train(cfg) called directly) the run resumes with cfg as given; the checkpoint a kill cut short
    (.last.ckpt.<pid>.<random>.tmp) is removed, the last good one kept."""
    from gru_experiments.runs.resume import resume_run

    run = interrupted_folder(tmp_path)
    leftover = run / "checkpoints" / ".last.ckpt.123.0a1b2c3d.tmp"
    leftover.write_bytes(b"half a checkpoint")
    cfg = compose_config(*TINY, f"resume={run}")
    monkeypatch.setattr(ResumePoint, "read", classmethod(lambda cls, found: point_of(found.path, cfg)))
    resumed, point = resume_run(cfg)
    assert resumed is cfg and point.run == RunDir(run) and point.step == 4
    assert not leftover.exists() and (run / "checkpoints" / "last.ckpt").read_bytes() == b"checkpoint"
    assert capsys.readouterr().out == f"resuming {run} from {run / 'checkpoints' / 'last.ckpt'}\n"


def saved_run(tmp_path: Path, cfg, config_text: str | None = None) -> tuple[RunDir, Path]:
    """A run folder whose .hydra/config.yaml is `cfg` (or `config_text`): the run and that file."""
    config = tmp_path / "run" / ".hydra" / "config.yaml"
    config.parent.mkdir(parents=True)
    if config_text is None:
        OmegaConf.save(cfg, config)
    else:
        config.write_text(config_text)
    return RunDir(tmp_path / "run"), config


@pytest.mark.parametrize("text, problem", [
    (None, "is missing"),
    ("- a list\n- of keys\n", "is damaged (not a mapping of keys)"),
    ("seed: [1234\n", "is damaged (while parsing a flow sequence)"),
    ("seed: 1234\nmodel:\n  name: astra_alpha\n", "is damaged (cut off: it lacks model.architecture, data.seq_len, "
                                                  "data.batch_size, ...)"),
], ids=["missing", "not_a_mapping", "not_yaml", "cut_off"])
def test_a_missing_or_damaged_saved_config_gives_way_to_the_checkpoints_record(compose_config, tmp_path, capsys, text,
                                                                                problem):
    cfg = compose_config(*TINY, "data.batch_size=4")
    run, config = saved_run(tmp_path, cfg, text)
    if text is None:
        config.unlink()
    point = point_of(run.path, cfg, run_config=OmegaConf.to_container(cfg, resolve=False))
    resumed = saved_config(run, point)
    assert resumed.data.batch_size == 4 and resumed.model.name == "astra_alpha"
    assert capsys.readouterr().out == (f"{config} {problem}: resuming with the config that checkpoint "
                                       f"{point.checkpoint} recorded\n")
    with pytest.raises(UserError, match=re.escape(
            f"{config} {problem}, and checkpoint {point.checkpoint} is from before checkpoints recorded their config")):
        saved_config(run, point_of(run.path, cfg))  # and no record to fall back on


def test_a_saved_config_edited_since_the_checkpoint_is_refused_naming_the_key(compose_config, tmp_path):
    cfg = compose_config(*TINY, "data.batch_size=4")
    run, config = saved_run(tmp_path, compose_config(*TINY, "data.batch_size=4", "data.seq_len=64"))
    point = point_of(run.path, cfg, run_config=OmegaConf.to_container(cfg, resolve=False))
    with pytest.raises(UserError, match=re.escape(
            f"{config} says data.seq_len=64, but checkpoint {point.checkpoint} was trained with data.seq_len=32: the "
            "saved config was edited since, and a resume continues the run as it was; restore data.seq_len=32 there")):
        saved_config(run, point)


def test_a_resume_deletes_the_keys_its_command_deletes(compose_config):
    from gru_experiments.runs.resume import resumed_config

    saved = OmegaConf.create(OmegaConf.to_container(compose_config(*TINY)))  # as saved_config reads it: no struct
    overrides = ["resume=RUN", "~early_stopping.min_delta", "~probe.keys"]  # the run has no probe.keys: nothing to do
    cfg = resumed_config(saved, compose_config(*TINY, *overrides[1:2]), overrides)
    assert "min_delta" not in cfg.early_stopping and "min_delta" in saved.early_stopping
    assert cfg.early_stopping.monitor == saved.early_stopping.monitor and cfg.probe == saved.probe


# --- issue 72: a resume writes nothing until its whole config is accepted ---------------------------------------------

@pytest.fixture(scope="module")
def one_batch_run(tmp_path_factory) -> tuple[Path, Path]:
    """(root, run): a run on a corpus whose validation split fills one batch, cut after its last checkpoint (its
    summary gone): a resume finishes it. Copy it before changing it (`resumable`)."""
    from conftest import make_text

    import gru_experiments

    root = tmp_path_factory.mktemp("one_batch")
    corpus = root / "short.txt"
    corpus.write_text(make_text(4000, seed=3), encoding="utf-8")
    summary = gru_experiments.train([*RECIPE[:-1], "logger=none", f"data.path={corpus}"], root=root)
    run = Path(summary["run_dir"])
    (run / "summary.json").unlink()
    return corpus, run


def resumable(one_batch_run, tmp_path) -> tuple[Path, Path, Path]:
    """(root, run, corpus): a copy of the cut run and of its corpus under a fresh root."""
    corpus, run = one_batch_run
    root = tmp_path / "root"
    copy = root / "outputs" / "runs" / "astra_alpha" / run.name
    shutil.copytree(run, copy)
    return root, copy, corpus


def refused(root: Path, *overrides: str) -> str:
    import gru_experiments

    with pytest.raises(UserError) as info:
        gru_experiments.train(list(overrides), root=root)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_what_lightning_refuses_leaves_the_run_byte_identical_and_a_plain_resume_then_finishes(one_batch_run, tmp_path):
    import gru_experiments

    root, run, _ = resumable(one_batch_run, tmp_path)
    before = fingerprint(run)
    assert refused(root, f"resume={run}", "+trainer.limit_val_batches=0.5").startswith(
        "Lightning refuses the trainer settings: You requested to check 0.5 of the `val_dataloader` but 0.5 * 1 < 1")
    assert_untouched(before, fingerprint(run))
    assert gru_experiments.train([f"resume={run}"], root=root)["status"] == "completed"


@pytest.mark.parametrize("override, message", [
    ("trainer.gradient_clip_val=1e-6", "was trained with trainer.gradient_clip_val=1.0, but this command asks for "
                                       "trainer.gradient_clip_val=1e-06; a resume continues the run as it was: leave "
                                       "trainer.gradient_clip_val out"),
    ("+trainer.accumulate_grad_batches=2", "was trained with trainer.accumulate_grad_batches=1, but this command asks "
                                           "for trainer.accumulate_grad_batches=2"),
    ("hydra.run.dir=OTHER", "continues the run in its own folder, RUN, but hydra.run.dir=OTHER would train it into "
                            "another (the run left unfinished, the other without its first part): leave hydra.run.dir "
                            "out; to keep the run as it is, copy its folder and resume the copy"),
])
def test_a_resume_refuses_what_would_change_its_training_or_its_folder(one_batch_run, tmp_path, override, message):
    root, run, _ = resumable(one_batch_run, tmp_path)
    other = tmp_path / "other"
    before = fingerprint(run)
    said = refused(root, f"resume={run}", override.replace("OTHER", str(other)))
    assert message.replace("RUN", str(run)).replace("OTHER", str(other)) in said
    assert_untouched(before, fingerprint(run))
    assert not other.exists()


def test_a_run_whose_last_checkpoint_was_removed_says_so_and_what_to_do(one_batch_run, tmp_path):
    root, run, _ = resumable(one_batch_run, tmp_path)
    (run / "checkpoints" / "last.ckpt").unlink()
    (best,) = [p.name for p in (run / "checkpoints").glob("best-*.ckpt")]
    assert refused(root, f"resume={run}") == (
        f"run {run} has no checkpoints/last.ckpt, but it holds {best}: its last checkpoint was removed (a resume "
        f"continues from it alone); restore it, or copy {best} to checkpoints/last.ckpt to resume from that "
        "checkpoint's step (the steps after it train again)")


def test_a_run_whose_corpus_moved_resumes_on_the_same_text_elsewhere(one_batch_run, tmp_path, capsys):
    import gru_experiments

    root, run, corpus = resumable(one_batch_run, tmp_path)
    moved = tmp_path / "moved.txt"
    corpus.rename(moved)
    try:
        assert refused(root, f"resume={run}") == (
            f"run {run} trained on {corpus}, which is not there any more; if the text moved, give its new place: "
            f"python train.py resume={run} data.path=NEW (the same text: its sha256 is checked against the "
            "checkpoint's)")
        edited = tmp_path / "edited.txt"
        edited.write_text(moved.read_text() + "x")
        assert refused(root, f"resume={run}", f"data.path={edited}").startswith(f"the corpus changed since run {run}")
        summary = gru_experiments.train([f"resume={run}", f"data.path={moved}"], root=root)
    finally:
        moved.rename(corpus)
    assert summary["status"] == "completed" and summary["corpus"] == str(moved)
    assert f"data.path={moved}: the run trained on {corpus}; it resumes on this file" in capsys.readouterr().out
