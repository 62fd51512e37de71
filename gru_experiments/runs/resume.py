"""Continuing an interrupted run in its own folder, from checkpoints/last.ckpt, with the config it was
started with (python train.py resume=last | resume=RUN_DIR): `rewrite_argv` before Hydra starts,
`resume_point` and `record_resume` inside train(). How, and what a resume may not change:
docs/internals.md, *Resuming a run*.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gru_experiments.errors import UserError
from gru_experiments.legacy import upgrade_overrides
from gru_experiments.runs.run_dir import CHECKPOINTS, HYDRA, LAST_CHECKPOINT, RunDir, newest_run
from gru_experiments.validation import MISSING, is_int, select

LAST = "last"
# Keys an older run may have recorded that no config has now (the evaluation's cost is the one key
# evaluation.budget): a resume drops them from the recorded overrides, and says so.
REMOVED_KEYS = ("evaluation.windowed_stride", "evaluation.max_tokens", "evaluation.curve_point_tokens",
                "evaluation.long_point_tokens", "evaluation.validation_tokens", "evaluation.batch_tokens",
                "model.eval_max_tokens", "model.eval_long_point_tokens")
RENAMED_KEYS = {"weight_decay": "optim.weight_decay"}  # the recipe's keys live in its group (conf/optim/)


def find_run(resume: str, log_dir, model_name: str) -> RunDir:
    """The run folder to continue for resume=last or resume=RUN_DIR; UserError if it cannot be
    resumed (no such folder, no checkpoint yet, already finished). Reads no checkpoint."""
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
            raise UserError(f"resume={resume} is a file; resume takes a run folder (the one holding "
                            f"checkpoints/), e.g. resume={_run_of_file(path)}")
        if not path.is_dir():
            raise UserError(f"resume={resume}: no such run folder")
        run = RunDir(path)
    run = RunDir(run.path.resolve())
    if not run.checkpoint_dir.is_dir() and not (run.path / HYDRA).is_dir():
        raise UserError(f"{which} is not a run folder (it has neither {CHECKPOINTS}/ nor {HYDRA}/); resume takes "
                        "the folder of a run that train.py started, e.g. outputs/runs/<model>/<time>")
    if not run.checkpoint.is_file():
        raise UserError(f"{which} has no {LAST_CHECKPOINT}: it stopped before its first checkpoint "
                        "(written every checkpoint.every_n_steps steps and at epoch ends); start it afresh")
    if run.finished:
        raise UserError(f"{which} already finished (it has a summary.json): nothing to resume"
                        + ("; to resume an older run, name its folder: resume=RUN_DIR" if resume == LAST else ""))
    return run


def _run_of_file(path: Path) -> Path:
    return path.parent.parent if path.parent.name == CHECKPOINTS else path.parent


@dataclass
class ResumePoint:
    """A run's last checkpoint as far as resuming needs it before Lightning loads it: read
    memory-mapped (the tensors stay on disk), so checking it costs next to nothing."""
    run: RunDir
    checkpoint: Path
    step: int
    hyper_parameters: dict
    tokenizer: dict  # the tokenizer's state
    wandb_run_id: str | None
    planned_steps: int | None = None  # the step the run was to stop at when it wrote the checkpoint (task.py)

    @classmethod
    def read(cls, run: RunDir) -> ResumePoint:
        """Refuses (UserError) a checkpoint that is unreadable, unsafe or not a training checkpoint."""
        from gru_experiments.runs.checkpoints import TRAINING_KEYS, read_checkpoint, wandb_run_id

        saved = read_checkpoint(run.checkpoint, require=TRAINING_KEYS, mmap=True)
        return cls(run=run, checkpoint=run.checkpoint, step=int(saved["global_step"]),
                   hyper_parameters=dict(saved["hyper_parameters"]), tokenizer=saved["tokenizer"],
                   wandb_run_id=wandb_run_id(saved),
                   planned_steps=(saved.get("train_statistics") or {}).get("planned_steps"))

    def check(self, hyper_parameters: dict, tokenizer) -> None:
        """The checkpoint must hold the model this config builds: same tokenizer and architecture (its learning
        rate and recipe: check_config)."""
        from gru_experiments.runs.checkpoints import check_tokenizer

        check_tokenizer({"tokenizer": self.tokenizer, "hyper_parameters": self.hyper_parameters}, self.checkpoint,
                        tokenizer=tokenizer)
        for key in ("architecture", "vocab_size"):
            if self.hyper_parameters.get(key) != hyper_parameters[key]:
                raise UserError(f"checkpoint {self.checkpoint} holds a model with {key} "
                                f"{self.hyper_parameters.get(key)}, but this config builds {hyper_parameters[key]}; "
                                "resume with the run's own model settings")

    def check_config(self, cfg) -> None:
        """What a resume may not change, read from the composed config alone, so that train.py refuses it before
        anything is written: the learning rate and every recipe key (the optimiser's state and schedule in the
        checkpoint belong to them: another recipe would not even load, another rate would silently train on),
        and a step limit that would train nothing and mark the run finished."""
        saved, asked = _pinned(self.hyper_parameters), _pinned({"lr": cfg.model.get("lr"), "optim": cfg.get("optim")})
        for key, value in saved.items():
            if asked.get(key) != value:
                raise UserError(f"checkpoint {self.checkpoint} was trained with {key}={_shown(value)}, but this config "
                                f"asks for {key}={_shown(asked.get(key))}; a run resumes with its own learning rate "
                                "and recipe: leave model.lr and optim out of the command")
        self.check_length(step_limit(cfg))

    def check_length(self, limit: int | None) -> None:
        """A resume trains on from its checkpoint: a step limit at or below the checkpoint's step is refused (the
        run would train nothing and then count as finished, its remaining steps lost), but for a run whose
        training was complete (killed in its evaluation: the resume finishes that)."""
        if limit is None or limit > self.step or (limit == self.step and self.planned_steps in (None, self.step)):
            return
        own = f"; its own limit is step {self.planned_steps:,}" if self.planned_steps else ""
        raise UserError(f"checkpoint {self.checkpoint} is at step {self.step:,}, but this resume would stop training "
                        f"at step {limit:,} (trainer.max_steps, or model.epochs x model.steps_per_epoch): it "
                        f"would train nothing and the run would count as finished{own}; resume with a step limit "
                        f"above {self.step:,}, or without one")

    def optimiser_overrides(self) -> list[str]:
        """model.lr and every optim key as the checkpoint was trained ([] for a counted model): a resumed run
        keeps its own, also where a model config has changed since (a new learning rate, a new recipe)."""
        lr, recipe = self.hyper_parameters.get("lr"), _recipe_of(self.hyper_parameters)
        if lr is None or recipe is None:
            return []
        as_override = lambda value: "[" + ",".join(map(repr, value)) + "]" if isinstance(value, list) else value  # noqa: E731
        return [f"model.lr={lr!r}"] + [f"optim.{key}={as_override(value)}" for key, value in recipe.to_dict().items()]


def _pinned(hyper_parameters: dict) -> dict:
    """A run's learning rate and recipe as the keys a command line names: {"model.lr": ..., "optim.name": ...}."""
    recipe = _recipe_of(hyper_parameters)
    return {"model.lr": hyper_parameters.get("lr"),
            **{f"optim.{key}": value for key, value in (recipe.to_dict() if recipe else {}).items()}}


def _shown(value) -> str:
    return "[" + ", ".join(map(repr, value)) + "]" if isinstance(value, (list, tuple)) else repr(value)


def step_limit(cfg) -> int | None:
    """The training step a config stops at: trainer.max_steps or the model's recipe (epochs x steps per
    epoch), whichever comes first; None when neither bounds it, and for a fast_dev_run (a smoke run of its own)."""
    from gru_experiments.runs.recipe import recipe_length

    if select(cfg, "trainer.fast_dev_run") not in (MISSING, None, False, 0):
        return None
    max_steps = select(cfg, "trainer.max_steps")
    limits = [max_steps] if is_int(max_steps) and max_steps >= 0 else []
    if is_int(select(cfg, "model.epochs")):
        epochs, per_epoch = recipe_length(cfg)
        limits.append(epochs * per_epoch)
    return min(limits, default=None)


def _recipe_of(hyper_parameters: dict):
    from gru_experiments.runs.recipe import Recipe

    return Recipe.recorded(hyper_parameters.get("optim"), hyper_parameters.get("weight_decay"))


def resume_point(cfg) -> ResumePoint | None:
    """For resume=last|RUN_DIR in cfg: the run and its checkpoint, resolved, read cheaply and checked against
    cfg (`ResumePoint.check_config`); None without resume. Temporary files of a save cut short by the
    interruption are removed."""
    resume = cfg.get("resume")
    if resume is None:
        return None
    from gru_experiments.files import leftover_temporaries

    run = find_run(resume, cfg.paths.log_dir, cfg.model.name)
    point = ResumePoint.read(run)
    point.check_config(cfg)
    for leftover in leftover_temporaries(run.checkpoint_dir, "*.ckpt"):
        leftover.unlink(missing_ok=True)
    return point


# --- command line ---------------------------------------------------------------------

def rewrite_argv(argv: list[str], config_dir, config_name: str = "train") -> list[str]:
    """If the command line asks to resume, return the command line that resumes that run with
    its own config; otherwise return argv in today's names (legacy.upgrade_overrides: model=astra_alpha_seed
    is experiment=astra_alpha_original). Raises UserError when it cannot resume."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    register_model_experiments(config_dir)
    argv, args = _in_todays_names(argv)
    parser = OverridesParser.create()
    try:
        given = parser.parse_overrides(args.overrides)
    except Exception:  # a malformed override: Hydra reports it itself
        return argv
    resume = next((o for o in given if o.key_or_group == "resume" and not o.is_delete()), None)
    if resume is None or resume.value() in (None, "null"):
        return argv
    if args.multirun:
        raise UserError("resume continues a single run; drop -m/--multirun")
    value = str(resume.value())
    if value == LAST:
        cfg = _compose_without_hydra(config_dir, args.config_name or config_name, args.overrides)
        if cfg is None:
            return argv  # the overrides do not compose (unknown model, typo): Hydra says why
        run = find_run(LAST, cfg.paths.log_dir, cfg.model.name)
    else:
        run = find_run(value, None, "")
    # Refuse an unreadable or unsafe checkpoint now, before Hydra writes into the run folder.
    point = ResumePoint.read(run)

    recorded = upgrade_overrides(_recorded_overrides(run))
    dropped = [o for o in recorded if _key(parser, o).lstrip("+~") in REMOVED_KEYS]
    if dropped:
        print(f"resuming without {', '.join(dropped)}: gone since, the evaluation's cost is evaluation.budget")
        recorded = [o for o in recorded if o not in dropped]
    recorded = [RENAMED_KEYS[_key(parser, o)] + "=" + o.partition("=")[2] if _key(parser, o) in RENAMED_KEYS else o
                for o in recorded]
    user = [o for o in args.overrides if _key(parser, o) not in ("resume", "hydra.run.dir", "hydra.output_subdir")]
    user_keys = {_key(parser, o) for o in user}
    # The run's own learning rate and recipe, whatever its model file says now; one the user names instead
    # is checked against the checkpoint (ResumePoint.check).
    named = {key for key in user_keys if key in ("model.lr", "optim") or key.startswith("optim.")}
    pinned = [o for o in point.optimiser_overrides()
              if not any(_key(parser, o) == key or _key(parser, o).startswith(key + ".") for key in named)]
    pinned_keys = {_key(parser, o) for o in pinned}
    recorded = [o for o in recorded if _key(parser, o) not in pinned_keys] + pinned
    merged = [o for o in recorded if _key(parser, o) not in user_keys | {"resume"}] + user
    merged.append(f"resume={quote(str(run.path))}")
    cfg = _compose_without_hydra(config_dir, args.config_name or config_name, merged)
    if cfg is not None:  # else Hydra says why it does not compose
        point.check_config(cfg)
    # Hydra records nothing: record_resume does, once training has checked the rest, so a refused resume
    # leaves the run folder as it was.
    merged += [f"hydra.run.dir={quote(str(run.path))}", "hydra.output_subdir=null"]
    flags = _without(argv[1:], args.overrides)
    print(f"resuming {run.path} from {run.checkpoint}")
    return [argv[0], *flags, *merged]


def _in_todays_names(argv: list[str]):
    """argv with ckpt_path= as resume= and every old name today's (legacy.upgrade_overrides,
    a line each), and Hydra's parse of it."""
    from hydra._internal.utils import get_args_parser

    # ckpt_path=last|RUN_DIR is Lightning's spelling of the same request.
    argv = [f"resume={arg.partition('=')[2]}" if arg.startswith("ckpt_path=") else arg for arg in argv]
    args = get_args_parser().parse_args(argv[1:])
    if (upgraded := upgrade_overrides(args.overrides)) != args.overrides:
        argv = [argv[0], *_without(argv[1:], args.overrides), *upgraded]
        args = get_args_parser().parse_args(argv[1:])
    return argv, args


def register_model_experiments(config_dir) -> None:
    """Every model is also an experiment of its own: experiment=ngram2 is model=ngram2. So one multirun over
    `experiment` can train models and experiments side by side (sweep.py, conf/sweep.yaml's ladder). Held in
    Hydra's ConfigStore, which its launchers hand on to their workers (joblib, SLURM)."""
    from hydra.core.config_store import ConfigStore

    conf, store = Path(config_dir), ConfigStore.instance()
    for path in sorted((conf / "model").glob("*.yaml")):
        if not (conf / "experiment" / path.name).is_file():
            store.store(group="experiment", name=path.stem, package="_global_",
                        node={"defaults": [{"override /model": path.stem}]})


def record_resume(run: RunDir, cfg) -> None:
    """This resume's config in .hydra/resumed_<time>/ (config.yaml, hydra.yaml, overrides.yaml, as Hydra writes
    them), once every check has passed; the first part's .hydra/ stays as it was. Nothing without Hydra
    (train(cfg) called directly)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    hydra = HydraConfig.instance().cfg
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")
    run.write_config_record(cfg, hydra, hydra.hydra.overrides.task, subdir=f"{HYDRA}/resumed_{stamp}")


def _recorded_overrides(run: RunDir) -> list[str]:
    """The overrides the run was last started with (the newest resume's, else the original's)."""
    from omegaconf import OmegaConf

    record = run.overrides_file()
    if not record.is_file():
        raise UserError(f"{run.path} has no .hydra/overrides.yaml, so its config is unknown; "
                        "it is not a run folder written by train.py")
    return [str(o) for o in OmegaConf.load(record)]


def _key(parser, override: str) -> str:
    parsed = parser.parse_override(override)
    return parsed.key_or_group + (f"@{parsed.package}" if parsed.package else "")


def _without(items: list[str], remove: list[str]) -> list[str]:
    remaining = list(items)
    for item in remove:
        remaining.remove(item)
    return remaining


def quote(value: str) -> str:
    """A value as a Hydra override token: quoted unless it is plainly a path."""
    if re.fullmatch(r"[\w./\-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _compose_without_hydra(config_dir, config_name: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    task_overrides = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    try:
        with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3"):
            return compose(config_name=config_name, overrides=task_overrides)
    except (HydraException, OmegaConfBaseException):
        return None
