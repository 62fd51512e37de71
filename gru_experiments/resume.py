"""Continuing an interrupted run: which run, and with which config.

    python train.py resume=last model=astra_beta     # the newest astra_beta run
    python train.py resume=outputs/runs/astra_beta/2026-01-02_03-04-05_123456

A resumed run continues in its own folder from checkpoints/last.ckpt, with the config it
was started with: `rewrite_argv` (called by train.py before Hydra starts) replaces the
command line with the run's recorded overrides plus any new ones, points hydra.run.dir at
the run folder, and records this session's config in .hydra/resumed_<time>/ so the
original .hydra/ stays as it was.

`find_run` is what train() uses, so `resume=` also works when train(cfg) is called directly.
This module imports nothing heavy, so train.py stays quick to start.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from gru_experiments.errors import UserError
from gru_experiments.runs import read_summary

LAST = "last"
CHECKPOINT = Path("checkpoints") / "last.ckpt"


def run_candidates(log_dir, model_name: str) -> list[Path]:
    """Run folders of `model_name` under log_dir that have a last checkpoint: single runs
    (runs/<model>/<time>) and multirun jobs (multiruns/<time>/<num>_<model>)."""
    log_dir = Path(log_dir)
    found = list(log_dir.glob(f"runs/{glob_escape(model_name)}/*/{CHECKPOINT}"))
    found += [p for p in log_dir.glob(f"multiruns/*/*_{glob_escape(model_name)}/{CHECKPOINT}")
              if p.parents[1].name.split("_", 1)[0].isdigit()]
    return [p.parents[1] for p in found]


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def newest_run(log_dir, model_name: str) -> Path:
    """The run of `model_name` whose last checkpoint was written most recently."""
    candidates = run_candidates(log_dir, model_name)
    if not candidates:
        raise UserError(f"resume=last: no {model_name} run with a checkpoint under {Path(log_dir)}; "
                        f"start one with: python train.py model={model_name}")
    return max(candidates, key=lambda run: (run / CHECKPOINT).stat().st_mtime)


def find_run(resume: str, log_dir, model_name: str) -> tuple[Path, Path]:
    """(run folder, its last checkpoint) for resume=last or resume=RUN_DIR; UserError if the
    run cannot be resumed."""
    resume = str(resume)
    if resume == LAST:
        run = newest_run(log_dir, model_name)
        which = f"the newest {model_name} run, {run},"
    else:
        run = Path(resume).expanduser()
        which = f"run {run}"
        if run.is_file():
            raise UserError(f"resume={resume} is a file; resume takes a run folder (the one holding "
                            f"checkpoints/), e.g. resume={_run_of_file(run)}")
        if not run.is_dir():
            raise UserError(f"resume={resume}: no such run folder")
    run = run.resolve()
    checkpoint = run / CHECKPOINT
    if not checkpoint.is_file():
        raise UserError(f"{which} has no {CHECKPOINT}: it stopped before its first checkpoint "
                        "(written every checkpoint.every_n_steps steps and at epoch ends); start it afresh")
    summary = read_summary(run)
    if summary is not None and summary.get("status") != "failed":  # a failed run may be continued
        raise UserError(f"{which} already finished (it has a summary.json): nothing to resume"
                        + ("; to resume an older run, name its folder: resume=RUN_DIR" if resume == LAST else ""))
    return run, checkpoint


def _run_of_file(path: Path) -> Path:
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


# --- command line ---------------------------------------------------------------------

def rewrite_argv(argv: list[str], config_dir, config_name: str = "train") -> list[str]:
    """If the command line asks to resume, return the command line that resumes that run with
    its own config; otherwise return argv unchanged. Raises UserError when it cannot resume."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    # ckpt_path=last|RUN_DIR is Lightning's spelling of the same request.
    argv = [f"resume={arg.partition('=')[2]}" if arg.startswith("ckpt_path=") else arg for arg in argv]
    args = get_args_parser().parse_args(argv[1:])
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
        run, _ = find_run(LAST, cfg.paths.log_dir, cfg.model.name)
    else:
        run, _ = find_run(value, None, "")
    # Refuse an unreadable or unsafe checkpoint now, before Hydra writes into the run folder.
    from gru_experiments.checkpoints import TRAINING_KEYS, read_checkpoint

    read_checkpoint(run / CHECKPOINT, require=TRAINING_KEYS)

    recorded = _recorded_overrides(run)
    user = [o for o in args.overrides if _key(parser, o) not in ("resume", "hydra.run.dir", "hydra.output_subdir")]
    user_keys = {_key(parser, o) for o in user}
    merged = [o for o in recorded if _key(parser, o) not in user_keys | {"resume"}] + user
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")
    merged += [f"resume={quote(str(run))}", f"hydra.run.dir={quote(str(run))}",
               f"hydra.output_subdir={quote(f'.hydra/resumed_{stamp}')}"]
    flags = _without(argv[1:], args.overrides)
    print(f"resuming {run} from {run / CHECKPOINT}")
    return [argv[0], *flags, *merged]


def _recorded_overrides(run: Path) -> list[str]:
    """The overrides the run was last started with (the newest resume's, else the original's)."""
    from omegaconf import OmegaConf

    records = sorted(run.glob(".hydra/resumed_*/overrides.yaml")) or [run / ".hydra" / "overrides.yaml"]
    if not records[-1].is_file():
        raise UserError(f"{run} has no .hydra/overrides.yaml, so its config is unknown; "
                        "it is not a run folder written by train.py")
    return [str(o) for o in OmegaConf.load(records[-1])]


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
