"""The whole study in one command: a Hydra multirun of train.py over the models, then the report.

    python sweep.py                                   # the six GRU models, full recipe
    python sweep.py preset=smoke                      # every model for a few steps (minutes on a CPU)
    python sweep.py leviathan=true                    # ... and the Leviathan LSTM
    python sweep.py models=[astra_alpha,scribe_alpha] data.path=my.txt logger=csv
    python sweep.py models=ladder                     # the language-model ladder (conf/sweep.yaml model_sets)
    python sweep.py models=[astra_beta,transformer_beta_original]  # a model beside its variant
    python sweep.py models=grid training=windows,streams  # each model trained both ways: the training x inference grid
    python sweep.py experiments=recall_horizon probe=recall,none  # conf/experiment/ configs as the jobs
    python sweep.py models=[astra_alpha,mingru] seeds=3  # each setting trained with seeds 1, 2 and 3 (or seed=1,2,3)
    python sweep.py report=outputs/multiruns/<sweep>  # only (re)build a sweep folder's report

sweep.py's own keys are in conf/sweep.yaml (models, model_sets, experiments, experiment_sets, leviathan, seeds,
report). Every other argument is
a train.py override and applies to every job: preset=..., data.path=..., trainer=ddp, logger=...,
hydra/launcher=parallel|slurm, hydra.sweep.dir=DIR (the sweep folder; default outputs/multiruns/<time>).
The report (report.md, results.csv, plots) goes into the sweep folder; with W&B it also goes to a
"summary" run in the sweep's W&B group. Exit status 1 when a job failed or is missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gru_experiments.errors import UserError
from gru_experiments.runs.jobs import command_line, job
from gru_experiments.validation import check_finite

ROOT = Path(__file__).resolve().parent
CONF = ROOT / "conf"
os.environ.setdefault("PROJECT_ROOT", str(ROOT))


def named_list(value, sets, kind: str, known: list[str]) -> list[str]:
    """A list of config names from `name`, `a,b` or `[a,b]`, each one of `known` or a set in `sets` (its names)."""
    if isinstance(value, str):
        value = [name.strip() for name in value.split(",") if name.strip()]
    value = [name for item in value for name in (sets[item] if item in sets else [item])]  # a set: its names
    unknown = [name for name in value if name not in known]
    if unknown or not value:
        raise UserError(f"unknown {kind}(s) {unknown or 'none given'}; available: {', '.join(known)}")
    repeated = sorted({name for name in value if value.count(name) > 1}, key=value.index)
    if repeated:
        print(f"sweep.py: {kind}s= names {', '.join(repeated)} more than once: each is trained once (seeds=N trains "
              "every setting N times)", flush=True)
    return list(dict.fromkeys(value))


def config_names(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


def parse_arguments(argv: list[str]) -> tuple[DictConfig, list[str]]:
    """sweep.py's settings (conf/sweep.yaml + its keys from argv) and the train.py overrides."""
    settings = OmegaConf.load(CONF / "sweep.yaml")
    own, overrides = [], []
    for arg in argv:
        key = arg.split("=", 1)[0]
        if key in settings:
            own.append(arg)
        elif key in ("model", "+model", "experiment", "+experiment", "-m", "--multirun"):
            raise UserError(f"{arg!r}: sweep.py chooses the models with models=[a,b,...], the experiments with "
                            "experiments=[a,b,...] (see conf/sweep.yaml)")
        else:
            overrides.append(arg)
    for arg in own:  # report= and models= given empty read as null: the whole default study would start
        key, _, value = arg.partition("=")
        if not value.strip().strip("'\""):
            what = "the sweep folder to report on (report=outputs/multiruns/<time>)" if key == "report" else "a value"
            raise UserError(f"{arg!r} gives {key} no value, and the whole default study would start: give {what}, "
                            f"or leave {key} out")
    given = {arg.split("=", 1)[0] for arg in own}
    if {"models", "experiments"} <= given:
        raise UserError("models= and experiments= both pick the jobs (an experiment names its own model); give one")
    settings = OmegaConf.merge(settings, OmegaConf.from_dotlist(own))
    if settings.seeds is not None:
        overrides.append(seed_override(settings.seeds, overrides))
    if settings.experiments is not None:
        if settings.leviathan:  # it adds Leviathan to models=, which experiments= replaces
            raise UserError("leviathan=true adds Leviathan to models=; experiments= names its own jobs (each its "
                            "model): leave leviathan=true out, or sweep models= instead")
        settings.experiments = named_list(settings.experiments, settings.experiment_sets, "experiment",
                                          config_names("experiment"))
        return settings, overrides
    settings.models = named_list(settings.models, settings.model_sets, "model", config_names("model"))
    if settings.leviathan and "leviathan" not in settings.models:
        settings.models.append("leviathan")
    return settings, overrides


MAX_SEEDS = 100  # seeds=N's bound (conf/sweep.yaml): 100,000 seeds printed a 100,000-seed command, then an OSError


def seed_override(seeds, overrides: list[str]) -> str:
    """seeds=N as the train.py sweep seed=1,...,N; refused beside a seed= of the user's own, or above MAX_SEEDS."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise UserError(f"seeds={seeds!r}: give a whole number of seeds >= 1 (each setting trained with seeds 1..N)")
    if seeds > MAX_SEEDS:
        raise UserError(f"seeds={seeds}: at most {MAX_SEEDS} trainings of each setting (seeds=N trains every setting "
                        "N times, one job each); give fewer seeds, or several sweeps with seed=a,b,c")
    if any(o.split("=", 1)[0].lstrip("+~") == "seed" for o in overrides):
        raise UserError("seeds=N and seed=... both choose the seeds: give one (seed=1,2,3 names them)")
    return "seed=" + ",".join(str(seed) for seed in range(1, seeds + 1))


def first_values(overrides: list[str]) -> list[str]:
    """The overrides with each sweep (training=windows,streams) at its first value: one job's
    config, which compose can build (the multirun sweeps them all)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override() else o.input_line
            for o in parsed]


def resolve_sweep_dir(first_job: str, overrides: list[str]) -> Path:
    """The sweep folder exactly as train.py would compose it (hydra.sweep.dir, paths.* and all),
    fixed now so that sweep.py knows where the report goes. Composing also checks every override
    before anything is trained."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="train", overrides=[first_job, *first_values(overrides)],
                          return_hydra_config=True)
            check_finite(OmegaConf.to_container(cfg, resolve=False))  # model.lr=nan: refused before any job
            return Path(str(cfg.hydra.sweep.dir)).resolve()
    except (HydraException, OmegaConfBaseException) as error:
        raise UserError(f"the train.py overrides {overrides} do not compose: {error}") from None


def run_sweep(settings: DictConfig, overrides: list[str]) -> tuple[Path, int]:
    """The multirun of train.py over the experiments, else the models, with `overrides`, in a sweep folder of its own
    (runs/sweep_dir.py: its lock held meanwhile): a folder that holds this sweep already is continued (its cut jobs
    resumed, then the multirun, where a completed job skips itself), one that holds another is refused."""
    from gru_experiments.runs.sweep_dir import SweepDir, task_overrides

    key, jobs = ("model", settings.models) if settings.experiments is None else ("experiment", settings.experiments)
    sweep_dir = resolve_sweep_dir(f"{key}={jobs[0]}", overrides)
    command = [sys.executable, str(ROOT / "train.py"), "-m", f"{key}=" + ",".join(jobs),
               *(o for o in overrides if not o.startswith("hydra.sweep.dir=")), f'hydra.sweep.dir="{sweep_dir}"']
    folder = SweepDir(sweep_dir)
    with folder.claim(task_overrides(command[3:])) as continued:
        failed = 0
        for run in folder.cut_jobs() if continued else ():
            print(f"sweep.py: resuming the cut job {run.path.name}", flush=True)
            failed += subprocess.run([sys.executable, str(ROOT / "train.py"), f"resume={run.path}"],
                                     check=False).returncode != 0
        print(f"sweep.py: {len(jobs)} configs into {sweep_dir}{' (continued)' if continued else ''}\n  "
              f"{' '.join(command)}", flush=True)
        # A job that fails is recorded by the job itself (summary.json, W&B) and Hydra runs the
        # others; train.py then exits non-zero, and the report says which job failed.
        returncode = subprocess.run(command, check=False).returncode
    return sweep_dir, returncode or int(failed > 0)


def write_report(sweep_dir: Path):
    from gru_experiments.report.report import build_report, format_table, log_to_wandb, wandb_jobs
    from gru_experiments.runs.loggers import wandb_mode

    report = build_report(sweep_dir)  # NoResultsError (a UserError) for a folder with no results
    if wandb_jobs(report):
        run = log_to_wandb(report, wandb_mode())
        print(f"sweep.py: W&B summary run {run.id} in group {run.group!r} ({run.settings.mode})")
    print(format_table(report))
    print(f"\nreport: {report.files['report.md']}\nresults: {report.files['results.csv']}")
    return report


def main(argv: list[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__)
        return 0
    settings, overrides = parse_arguments(command_line(["sweep.py", *argv])[1:])  # ~/ expanded (runs/jobs.py)
    if settings.report:
        from gru_experiments.report.sweep_folder import check_sweep_folder

        if overrides:
            raise UserError(f"report=... only builds a report; these would be ignored: {overrides}")
        check_sweep_folder(Path(settings.report))  # a report is written into a sweep's folder, no other
        report = write_report(Path(settings.report))  # the report itself says what failed or is missing
        if report.problems:
            print(not_completed(report.problems), file=sys.stderr)
        return 0
    started = time.perf_counter()
    sweep_dir, returncode = run_sweep(settings, overrides)
    report = write_report(sweep_dir)
    print(f"sweep.py: {len(report.jobs)} jobs in {time.perf_counter() - started:.0f} s")
    if report.problems or returncode != 0:
        print(not_completed(report.problems, returncode), file=sys.stderr)
        return 1
    return 0


def not_completed(jobs, returncode: int = 0) -> str:
    """The line naming each job not completed, with its folder."""
    names = ", ".join(f"{job.model} ({job.status}{f', {job.job}' if job.job else ''})" for job in jobs)
    return f"sweep.py: not every job completed: {names or f'train.py exit {returncode}'}; see the report"


if __name__ == "__main__":
    with job(argv=sys.argv, report=True):  # input errors: one line, exit status 2
        sys.exit(main(sys.argv[1:]))
