"""Continuing an interrupted run in its own folder, from checkpoints/last.ckpt, with the config it was started with
(python train.py resume=last | resume=RUN_DIR): `resume_run` composes the run's own config with this command's
overrides and checks it, before validation builds the spec (so it reads the config itself, as the entry points do).
What a resume may not change: docs/internals.md, *Resuming a run*.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from gru_experiments.errors import UserError
from gru_experiments.runs.run_dir import CHECKPOINTS, HYDRA, LAST_CHECKPOINT, RunDir, newest_run
from gru_experiments.validation import MISSING, is_int, select

LAST = "last"


def find_run(resume: str, log_dir, model_name: str) -> RunDir:
    """The run folder to continue for resume=last or resume=RUN_DIR; UserError if it cannot be resumed."""
    resume = str(resume)
    if resume == LAST:
        run = newest_run(log_dir, model_name)
        if run is None:
            raise UserError(f"resume=last: no {model_name} run with a checkpoint under {Path(log_dir)}; "
                            f"start one with: python train.py model={model_name}")
        which = f"the newest {model_name} run, {run.path},"
    else:
        path = Path(resume).expanduser()
        which = f"run {path}"
        if path.is_file():
            run_of_file = path.parent.parent if path.parent.name == CHECKPOINTS else path.parent
            raise UserError(f"resume={resume} is a file; resume takes a run folder (the one holding "
                            f"checkpoints/), e.g. resume={run_of_file}")
        if not path.is_dir():
            raise UserError(f"resume={resume}: no such run folder")
        run = RunDir(path)
    run = RunDir(run.path.resolve())
    if not run.checkpoint_dir.is_dir() and not (run.path / HYDRA).is_dir():
        raise UserError(f"{which} is not a run folder (it has neither {CHECKPOINTS}/ nor {HYDRA}/); resume takes "
                        "the folder of a run that train.py started, e.g. outputs/runs/<model>/<time>")
    if not run.checkpoint.is_file():
        if others := sorted(p.name for p in run.checkpoint_dir.glob("*.ckpt")):
            raise UserError(f"{which} has no {LAST_CHECKPOINT}, but it holds {', '.join(others)}: its last checkpoint "
                            f"was removed (a resume continues from it alone); restore it, or copy {others[-1]} to "
                            f"{LAST_CHECKPOINT} to resume from that checkpoint's step (the steps after it train again)")
        raise UserError(f"{which} has no {LAST_CHECKPOINT}: it stopped before its first checkpoint "
                        "(written every checkpoint.every_n_steps steps and at epoch ends); start it afresh")
    if run.finished:
        summary = run.summary() or {}
        stopped = (f", stopped early at step {summary.get('stopped_at_step'):,}" if summary.get("stopped_early")
                   else "")
        raise UserError(f"{which} already finished (it has a summary.json{stopped}): nothing to resume"
                        + ("; to resume an older run, name its folder: resume=RUN_DIR" if resume == LAST else ""))
    return run


@dataclass
class ResumePoint:
    """A run's last checkpoint as far as resuming needs it before Lightning loads it (read memory-mapped: cheap)."""
    run: RunDir
    checkpoint: Path
    step: int
    hyper_parameters: dict
    tokenizer: dict  # the tokenizer's state
    wandb_run_id: str | None
    planned_steps: int | None = None  # the step the run was to stop at when it wrote the checkpoint (task.py)
    stopped_early: str | None = None  # why its early stopping stopped it (runs/stopping.py); None: it did not
    run_config: dict | None = None  # the config of the part that wrote it (unresolved; None before checkpoints kept it)
    corpus_sha256: str | None = None  # the corpus it trained on (data/corpus.py; None before checkpoints kept it)
    weights: dict | None = None  # {name: shape} of its state_dict (checkpoints.weight_shapes)

    @classmethod
    def read(cls, run: RunDir) -> ResumePoint:
        """Refuses (UserError) a checkpoint that is unreadable, unsafe or not a training checkpoint."""
        from gru_experiments.runs.checkpoints import TRAINING_KEYS, read_checkpoint, wandb_run_id, weight_shapes
        from gru_experiments.runs.stopping import stop_description, stopped_state

        saved = read_checkpoint(run.checkpoint, require=TRAINING_KEYS, mmap=True)
        stopped = stopped_state(saved)
        return cls(run=run, checkpoint=run.checkpoint, step=int(saved["global_step"]),
                   hyper_parameters=dict(saved["hyper_parameters"]), tokenizer=saved["tokenizer"],
                   wandb_run_id=wandb_run_id(saved),
                   planned_steps=(saved.get("train_statistics") or {}).get("planned_steps"),
                   stopped_early=stop_description(stopped) if stopped else None,
                   run_config=saved.get("run_config"), corpus_sha256=saved.get("corpus_sha256"),
                   weights=weight_shapes(saved["state_dict"]))

    def check(self, hyper_parameters: dict, tokenizer, weights: dict | None = None) -> None:
        """The checkpoint must hold the model this config builds: same tokenizer and architecture (its learning
        rate and recipe: check_config), and with `weights` ({name: shape} of the model's) every weight of it, so that
        Lightning's load cannot fail halfway."""
        from gru_experiments.runs.checkpoints import check_tokenizer, weights_mismatch

        check_tokenizer(self.tokenizer, self.hyper_parameters.get("vocab_size"), self.checkpoint, tokenizer)
        if (saved := self.hyper_parameters.get("architecture")) != hyper_parameters["architecture"]:
            raise UserError(f"checkpoint {self.checkpoint} holds a model with architecture {saved}, but this config "
                            f"builds {hyper_parameters['architecture']}; resume with the run's own model settings")
        if weights is not None and (problem := weights_mismatch(self.weights or {}, weights)):
            raise UserError(f"checkpoint {self.checkpoint} is damaged: {problem}; it cannot be resumed (resume from "
                            "a good copy of it, or start a new run)")

    def check_corpus(self, corpus) -> None:
        """The corpus (data/corpus.CorpusText) must be the text the run trained on, by its checkpoint's sha256."""
        if self.corpus_sha256 is not None and corpus.sha256 != self.corpus_sha256:
            raise UserError(f"the corpus changed since run {self.run.path} trained on it: {corpus.source} has sha256 "
                            f"{corpus.sha256}, but checkpoint {self.checkpoint} was trained on sha256 "
                            f"{self.corpus_sha256}; a resume continues on the run's own corpus: restore that text "
                            "(or start a new run)")

    def check_config(self, cfg, named: tuple[str, ...] | None = None) -> None:
        """What a resume may not change, refused before anything is written: the learning rate and every recipe key
        (the checkpoint's optimiser state and schedule belong to them), and a step limit that would train nothing.
        `named`: the keys this command names (None: unknown), so that another value is blamed on the saved config."""
        saved, asked = _pinned(self.hyper_parameters), _pinned({"lr": cfg.model.get("lr"), "optim": cfg.get("optim")})
        for key, value in saved.items():
            if asked.get(key) != value:
                on_command = named is None or any(_nested(key, n) or _nested(n, key) for n in named)
                advice = ("leave model.lr and optim out of the command" if on_command else
                          f"the command does not name {key}, so the run's saved config ({self.run.config_file}) "
                          "was changed since: restore its value there")
                raise UserError(f"checkpoint {self.checkpoint} was trained with {key}={_shown(value)}, but this config "
                                f"asks for {key}={_shown(asked.get(key))}; a run resumes with its own learning rate "
                                f"and recipe: {advice}")
        # a limit at or below the checkpoint's step would train nothing and then count the run as finished, but for
        # a run whose training was complete (killed in its evaluation: the resume finishes that)
        limit = step_limit(cfg)
        if limit is None or limit > self.step or (limit == self.step and self.planned_steps in (None, self.step)):
            return
        own = f"; its own limit is step {self.planned_steps:,}" if self.planned_steps else ""
        raise UserError(f"checkpoint {self.checkpoint} is at step {self.step:,}, but this resume would stop training "
                        f"at step {limit:,} (trainer.max_steps, or model.epochs x model.steps_per_epoch): it "
                        f"would train nothing and the run would count as finished{own}; resume with a step limit "
                        f"above {self.step:,}, or without one")


def _pinned(hyper_parameters: dict) -> dict:
    """A run's learning rate and recipe as the keys a command line names: {"model.lr": ..., "optim.name": ...}."""
    from gru_experiments.runs.recipe import Recipe

    recipe = Recipe.from_config(hyper_parameters["optim"]) if hyper_parameters.get("optim") else None
    return {"model.lr": hyper_parameters.get("lr"),
            **{f"optim.{key}": value for key, value in (recipe.to_dict() if recipe else {}).items()}}


def _nested(key: str, parent: str) -> bool:
    return key == parent or key.startswith(parent + ".")


def _shown(value) -> str:
    value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return "[" + ", ".join(map(repr, value)) + "]" if isinstance(value, (list, tuple)) else repr(value)


def step_limit(cfg) -> int | None:
    """The training step a config stops at: trainer.max_steps or epochs x steps per epoch, whichever comes first;
    None when neither bounds it, and for a fast_dev_run."""
    from gru_experiments.runs.recipe import recipe_length

    if select(cfg, "trainer.fast_dev_run") not in (MISSING, None, False, 0):
        return None
    max_steps = select(cfg, "trainer.max_steps")
    limits = [max_steps] if is_int(max_steps) and max_steps >= 0 else []
    if is_int(select(cfg, "model.epochs")):
        epochs, per_epoch = recipe_length(cfg)
        limits.append(epochs * per_epoch)
    return min(limits, default=None)


# --- the run's own config ------------------------------------------------------------

# What the checkpoint's training depends on beyond the model, its tokenizer, learning rate and recipe (checked
# against the checkpoint itself): a resume that names one with another value is refused. Early stopping's state is
# filed under its monitor and mode (Lightning's state_key): another of either would drop the wait count and the best.
# The trainer's keys that change the updates themselves (where Lightning's default stands for a key the run's config
# lacks); the others (validation, logging, the device) a resume may change.
TRAINING_TRAINER_KEYS = ("trainer.gradient_clip_val", "trainer.gradient_clip_algorithm",
                         "trainer.accumulate_grad_batches", "trainer.limit_train_batches", "trainer.overfit_batches")
KEPT = ("seed", "data.path", "data.seq_len", "data.batch_size", "data.train_fraction", "data.test_fraction", "training",
        "probe", "early_stopping.monitor", "early_stopping.mode", *TRAINING_TRAINER_KEYS)
# What every run's saved config has had, since the first: a config.yaml without one of them is damaged (cut off).
ALWAYS_SAVED = ("seed", "model.name", "model.architecture", "data.seq_len", "data.batch_size", "tokenizer", "trainer")
COMMAND_KEYS = ("resume", "ckpt_path")  # this command's own: never the run's


def resume_run(cfg, held=None) -> tuple[object, ResumePoint | None]:
    """For resume=last|RUN_DIR in cfg: the run's own config (its newest record in .hydra/; without one, cfg as given)
    with this command's overrides, and its checkpoint, read cheaply and checked; (cfg, None) without resume. `held`
    (an ExitStack) takes the run folder's lock before anything is read (RunDir.hold). A cut-off save's temporary
    files are removed."""
    from hydra.core.hydra_config import HydraConfig

    from gru_experiments.files import leftover_temporaries
    from gru_experiments.runs.jobs import multirun_job
    from gru_experiments.runs.run_contents import check_record, check_run

    resume = cfg.get("resume")
    if resume is None:
        return cfg, None
    if multirun_job():
        raise UserError("resume continues a single run; drop -m/--multirun")
    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path is not None and str(ckpt_path) != str(resume):
        raise UserError(f"resume={resume} and ckpt_path={ckpt_path} name two runs (ckpt_path is Lightning's name for "
                        "resume): give one of them")
    run = find_run(resume, cfg.paths.log_dir, cfg.model.name)
    if HydraConfig.initialized() and (folder := Path(HydraConfig.get().runtime.output_dir).resolve()) != run.path:
        raise UserError(f"resume={resume} continues the run in its own folder, {run.path}, but hydra.run.dir={folder} "
                        "would train it into another (the run left unfinished, the other without its first part): "
                        "leave hydra.run.dir out; to keep the run as it is, copy its folder and resume the copy")
    if held is not None:
        held.enter_context(run.hold("resume it"))
        if run.finished:  # the process that held it finished the run meanwhile
            raise UserError(f"run {run.path} finished while this command waited for it (it has a summary.json): "
                            "nothing to resume")
    named = None
    if HydraConfig.initialized():
        overrides = list(HydraConfig.get().overrides.task)
        named = tuple(override.split("=", 1)[0].lstrip("+~") for override in overrides)
    check_run(run, named)  # a run folder is data: only the callables the project names (or this command line)
    point = ResumePoint.read(run)
    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        composed = cfg
        saved = saved_config(run, point, named)
        # a corpus moved elsewhere is the run's own where its checkpoint's sha256 says so (prepare checks it)
        movable = ("data.path",) if point.corpus_sha256 is not None else ()
        cfg = resumed_config(saved, cfg, overrides, run.group_choices(), hydra.runtime.choices, run, movable)
        check_corpus_place(run, saved, cfg, point, resume)
        # what the merge kept of the run's (a group the command chose alike keeps the run's keys): the folder's again
        check_record(cfg, run.config_file, own=composed)
    point.check_config(cfg, named)
    for leftover in leftover_temporaries(run.checkpoint_dir, "*.ckpt"):
        leftover.unlink(missing_ok=True)
    print(f"resuming {run.path} from {run.checkpoint}")
    return cfg, point


def check_corpus_place(run: RunDir, saved, cfg, point: ResumePoint, resume) -> None:
    """The run's corpus where its config says it is, or one line on how to resume a run whose corpus moved."""
    was, now = (OmegaConf.select(c, "data.path", default=None) for c in (saved, cfg))
    if now is not None and now != was:
        print(f"data.path={now}: the run trained on {was}; it resumes on this file if it is the same text (its sha256 "
              f"is checked against the checkpoint's)")
    elif now is not None and not Path(str(now)).expanduser().is_file():
        how = (f"give its new place: python train.py resume={resume} data.path=NEW (the same text: its sha256 is "
               "checked against the checkpoint's)" if point.corpus_sha256 is not None else
               "restore it there (this checkpoint records no sha256 to check another place by)")
        raise UserError(f"run {run.path} trained on {now}, which is not there any more; if the text moved, {how}")


def saved_config(run: RunDir, point: ResumePoint, named=None):
    """What the run was trained with: its saved config (.hydra/), checked against the config its checkpoint recorded,
    or that record where the saved one is missing or damaged (said in a line); never today's defaults. UserError
    where neither holds it, or the saved config was edited since (a key of KEPT differs from the checkpoint's)."""
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    from gru_experiments.runs.run_contents import check_record

    where = run.config_file
    try:
        saved, problem = run.config(), None
        if saved is None:
            problem = f"{where} is missing"
        elif not OmegaConf.is_dict(saved):
            saved, problem = None, f"{where} is damaged (not a mapping of keys)"
    except (YAMLError, OmegaConfBaseException, UnicodeDecodeError, ValueError) as error:
        saved, problem = None, f"{where} is damaged ({str(error).splitlines()[0]})"
    recorded = OmegaConf.create(point.run_config) if point.run_config else None
    if saved is not None:
        expected = [*ALWAYS_SAVED, *(key for key in (_keys(recorded) if recorded is not None else ())
                                     if any(_nested(key, kept) for kept in (*KEPT, "model")))]
        required = [key for key in dict.fromkeys(expected)
                    if OmegaConf.select(saved, key, default=MISSING, throw_on_resolution_failure=False) is MISSING]
        if required:
            saved, problem = None, f"{where} is damaged (cut off: it lacks {', '.join(required[:3])}" \
                                   f"{', ...' if len(required) > 3 else ''})"
    if saved is None:
        if recorded is None:
            raise UserError(f"{problem}, and checkpoint {point.checkpoint} is from before checkpoints recorded their "
                            "config: the run's batch size, steps, corpus and logger are unknown, and a resume never "
                            "takes today's defaults for them; restore the file (or start a new run)")
        check_record(recorded, f"{point.checkpoint} (its recorded config)", named)  # data, as the folder's
        print(f"{problem}: resuming with the config that checkpoint {point.checkpoint} recorded")
        return recorded
    if recorded is not None:
        for key in KEPT:
            was, now = (OmegaConf.select(c, key, default=MISSING) for c in (recorded, saved))
            if was is not MISSING and now is not MISSING and was != now:
                raise UserError(f"{where} says {key}={_shown(now)}, but checkpoint {point.checkpoint} was trained with "
                                f"{key}={_shown(was)}: the saved config was edited since, and a resume continues the "
                                f"run as it was; restore {key}={_shown(was)} there (or start a new run)")
    return saved


def _lightning_default(key: str):
    import inspect

    from lightning.pytorch import Trainer

    parameter = inspect.signature(Trainer.__init__).parameters.get(key.removeprefix("trainer."))
    return MISSING if parameter is None else parameter.default


def _keys(config, prefix: str = "") -> list[str]:
    """Every leaf key of a config, dotted (a list is a leaf)."""
    keys = []
    for key in config:
        value, dotted = config._get_node(key), f"{prefix}{key}"
        keys += _keys(value, dotted + ".") if OmegaConf.is_dict(value) and len(value) else [dotted]
    return keys


def resumed_config(saved, composed, overrides: list[str], choices=None, today=None, run: RunDir | None = None,
                   movable: tuple[str, ...] = ()):
    """The run's saved config with this command's `overrides` applied, each with the value `composed` (this
    command's composition) gives it, but a group the run chose alike (`choices`), whose keys stay the run's; a key
    added since keeps today's default where the command chose the run's option of its group (`today`). UserError
    for an override a resume cannot take: a group that is no key (experiment=, preset=), or another value for a key
    of KEPT but those `movable` (data.path, where the checkpoint's sha256 checks the text)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    plain, choices, today = OmegaConf.to_container(composed, resolve=False), choices or {}, today or {}
    for group in [key for key in plain if key in today and choices.get(key) != today[key]]:
        plain.pop(group)  # another option's keys (today's default model, logger, ...) would not fit the run's
    merged, touched = OmegaConf.merge(plain, saved), []
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group.lstrip("+~")
        # a group the run chose alike keeps the run's keys (a plain key, null included, is applied)
        if key in COMMAND_KEYS or key.startswith("hydra") or (key in choices and choices[key] == override.value()):
            continue
        if override.is_delete():
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(merged, parent) if parent else merged
            if node is not None and leaf in node:
                del node[leaf]
            continue
        value = OmegaConf.select(composed, key, default=MISSING)
        if value is MISSING:
            raise UserError(f"{override.input_line}: a resume continues the run with its own config, where "
                            f"{override.key_or_group}= changes no one key; leave it out (or start a new run)")
        OmegaConf.update(merged, key, value, merge=False, force_add=True)
        touched += [max(key, kept, key=len) for kept in KEPT if (_nested(key, kept) or _nested(kept, key))
                    and max(key, kept, key=len) not in movable]
    for key in touched:  # named on the command line with another value than the run's
        was, now = (OmegaConf.select(c, key, default=MISSING) for c in (saved, merged))
        if was is MISSING and key in TRAINING_TRAINER_KEYS:
            was = _lightning_default(key)
        if was is not MISSING and was != now:
            raise UserError(f"{run.path if run else 'the run'} was trained with {key}={_shown(was)}, but this "
                            f"command asks for {key}={_shown(now)}; a resume continues the run as it was: leave "
                            f"{key} out (or start a new run)")
    for key in COMMAND_KEYS:
        merged[key] = composed.get(key)
    OmegaConf.set_struct(merged, True)
    return merged
