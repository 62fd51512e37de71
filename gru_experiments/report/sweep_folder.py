"""Reading a sweep folder: one JobResult per job (its summary.json, history.csv, samples.json and
config), in launch order, with a "missing" entry for each planned model that never started; and the
groupings the sections share (the ladder, a model's training modes side by side)."""

import math
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from gru_experiments.data.corpus import corpus_name
from gru_experiments.errors import NoResultsError, UserError
from gru_experiments.report.common import finite, group_by
from gru_experiments.runs.checks import model_family, model_recurrent
from gru_experiments.runs.loggers import read_history
from gru_experiments.runs.run_contents import check_record, check_run_files
from gru_experiments.runs.run_dir import RunDir
from gru_experiments.runs.sweep_dir import MULTIRUN, recorded_overrides


@dataclass
class JobResult:
    job: str  # the job folder's name, e.g. "0_astra_alpha" ("" for a job that never started)
    status: str  # completed | failed | incomplete (started, no summary yet) | missing (never started)
    values: dict = field(default_factory=dict)  # summary.json, completed with what the config says
    run_dir: Path | None = None
    history: dict = field(default_factory=dict)  # {metric: [(step, value), ...]}
    samples: dict | None = None
    logger: dict = field(default_factory=dict)  # the job's logger config (_target_, project, group)
    variant: str = ""  # what tells it from the sweep's other jobs of its model: "lr 0.001, recipe transformer"
    unreadable: Path | None = None  # its summary.json, there but not a JSON object (cut off while written, edited)
    config: dict | None = None  # its .hydra/config.yaml, unresolved (what tells its setting apart: seed_groups.py)
    overrides: list[str] = field(default_factory=list)  # its command line (.hydra/overrides.yaml): experiment=...

    @property
    def runs(self) -> list:
        """Its trainings: itself (a seed_groups.Setting has several)."""
        return [self]

    @property
    def n(self) -> int:
        return len(self.runs)

    @property
    def name(self) -> str:  # the model's config name
        return self.values.get("model") or self.job

    @property
    def recipe(self) -> str | None:
        """Its optimiser recipe's name (conf/optim/), None for a counted model."""
        return self.values.get("optim") if self.values.get("lr") is not None else None

    @property
    def training_mode(self) -> str | None:
        return self.values.get("training_mode")

    @property
    def recurrent(self) -> bool:
        """Whether its model carries a state from step to step (summary.json's "recurrent": the model's own)."""
        return self.values.get("recurrent") is True

    @property
    def model(self) -> str:
        """Its label in the report: the name, marked when trained with the state carried, its variant and,
        for a run stopped before its recipe's end, its steps ("astra_gamma (2,000 of 8,000 steps)")."""
        trained, recipe = self.number("train_steps"), self.number("recipe_steps")
        cut = f"{trained:,.0f} of {recipe:,.0f} steps" if trained and recipe and trained < recipe else ""
        streams = "streams" if self.training_mode == "streams" else ""
        notes = ", ".join(note for note in (streams, self.variant, cut) if note)
        return f"{self.name} ({notes})" if notes else self.name

    @property
    def training_window(self) -> int | None:
        """The tokens of a training window (summary.json's seq_len), None when unknown."""
        return self.values.get("seq_len")

    @property
    def training(self) -> str:
        """Its training mode and window, "windows (512)"; the mode alone when the window is unknown."""
        window = self.training_window
        return self.training_mode if window is None else f"{self.training_mode} ({window})"

    def best(self, key: str) -> float | None:
        """A finite number of the best checkpoint (summary["best"]; key "step" for its step), else None."""
        best = self.values.get("best")
        return self.number(key, best if isinstance(best, dict) else {})

    def number(self, key: str, values: dict | None = None) -> float | None:
        """A finite number from the summary (or `values`), else None."""
        value = (self.values if values is None else values).get(key)
        return None if finite(value) is None else value  # an int stays an int: "{:,}" writes no ".0"


@dataclass
class Report:
    sweep_dir: Path
    jobs: list[JobResult]
    overrides: list[str]
    files: dict[str, Path]  # name -> written file
    settings: list[JobResult] = field(default_factory=list)  # the jobs with each setting's runs as one (seed_groups.py)

    @property
    def problems(self) -> list[JobResult]:
        return [job for job in self.jobs if job.status != "completed"]


# --- reading a sweep folder --------------------------------------------------------------
def _select(cfg, key: str):
    return OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)


def planned_jobs(overrides: list[str]) -> list[list[str]]:
    """Each job a sweep's task overrides plan, in launch order (its number), as its overrides: Hydra's basic sweeper's
    product of the swept values (model=a,b seed=1,2: four jobs); [] where they do not parse as such a sweep."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return [job for batch in BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides),
                                                              None) for job in batch]
    except HydraException:
        return []


def missing_jobs(jobs: list[JobResult], overrides: list[str]) -> list[JobResult]:
    """A "missing" job for each that the sweep planned and whose folder is not there (never started, or removed):
    neither a job of its number (Hydra's hydra.job.num) nor of its overrides; its folder named where the sweep is over
    model= (<num>_<model>, Hydra's subdir)."""
    numbers = {_job_order(job.run_dir)[0] for job in jobs if job.run_dir is not None}
    recorded = {tuple(sorted(job.overrides)) for job in jobs}
    plan = planned_jobs(overrides) if overrides else []
    swept = {o for job in plan for o in job if sum(o in other for other in plan) < len(plan)}  # a value of a sweep
    missing = []
    for number, planned in enumerate(plan):
        if number in numbers or tuple(sorted(planned)) in recorded:
            continue
        chosen = dict(o.split("=", 1) for o in planned)
        name = chosen.get("model") or chosen.get("experiment") or ""
        seed = int(chosen["seed"]) if chosen.get("seed", "").isdigit() else None
        missing.append(JobResult(job=f"{number}_{name}" if "model" in chosen else "", status="missing",
                                 values={"model": name, "seed": seed},
                                 overrides=[o for o in planned if o in swept]))
    return missing


def read_summary(summary) -> dict:
    """A job's summary.json as a dict of its values ({} for none)."""
    return dict(summary) if isinstance(summary, dict) else {}


def read_job(job_dir: Path, sweep_dir: Path | None = None) -> JobResult:
    """The job in `job_dir`; UserError, in one line naming the script that upgrades `sweep_dir` (default the job's
    folder), for a job of an older layout (run_dir.refuse_older_layout)."""
    run = RunDir(job_dir)
    cfg = run.config(upgrade=sweep_dir)
    summary = run.summary()
    epochs, per_epoch = _select(cfg, "model.epochs"), _select(cfg, "model.steps_per_epoch")
    values = {
        "model": _select(cfg, "model.name"),
        "tokenizer": _select(cfg, "tokenizer.kind"),
        "training_mode": _select(cfg, "training.batching"),
        "lr": _select(cfg, "model.lr"),
        "seed": _select(cfg, "seed"),
        # the steps of the model's own recipe; none for a counted model
        "recipe_steps": epochs * per_epoch if isinstance(epochs, int) and isinstance(per_epoch, int) else None,
        "steps_per_epoch": per_epoch if isinstance(per_epoch, int) else None,  # the report's epochs (overfitting)
        "optim": _select(cfg, "optim.name"),
        **read_summary(summary),
        # its name (pystdlib), not the summary's path to the file
        "corpus": corpus_name(_select(cfg, "data.path"), _select(cfg, "data.url"), _select(cfg, "data.sha256")),
    }
    if values.get("family") is None:  # not finished: the config's model's
        values["family"] = model_family(_select(cfg, "model.architecture"))
    if not isinstance(values.get("recurrent"), bool):
        values["recurrent"] = model_recurrent(_select(cfg, "model.architecture"))
    status = ("incomplete" if not isinstance(summary, dict) else
              "failed" if summary.get("status") == "failed" else "completed")
    logger = {key: _select(cfg, f"logger.{key}") for key in ("_target_", "project", "group")}
    unreadable = run.summary_file if summary is None and run.summary_file.is_file() else None
    return JobResult(job=job_dir.name, status=status, values=values, run_dir=job_dir,
                     history=read_history(run.history_file), samples=run.samples(), logger=logger,
                     unreadable=unreadable, config=OmegaConf.to_container(cfg, resolve=False),
                     overrides=recorded_overrides(job_dir / ".hydra" / "overrides.yaml"))


def _job_order(job_dir: Path) -> tuple:
    hydra = job_dir / ".hydra" / "hydra.yaml"
    num = _select(OmegaConf.load(hydra), "hydra.job.num") if hydra.is_file() else None
    return (num if isinstance(num, int) else math.inf, job_dir.name)


def check_sweep_folder(folder: Path) -> None:
    """sweep.py report=FOLDER: a folder a multirun wrote (Hydra's multirun.yaml in it), or a folder of such folders
    (sweeps run side by side, reported together), so that a report is never written into another folder (a single
    run's, or outputs/runs/<model>/ of many single runs). `collect` says what a path that is not a folder is."""
    folder = Path(folder)
    if not folder.is_dir() or (folder / MULTIRUN).is_file() or any(folder.glob(f"*/{MULTIRUN}")):
        return
    single = (folder / ".hydra").is_dir() or (folder / "checkpoints").is_dir()
    raise UserError(f"{folder} is {'the folder of a single run' if single else 'not a sweep folder'}: it has no "
                    "multirun.yaml, which Hydra writes into every sweep's folder (python sweep.py ..., python train.py "
                    "-m ...); give a sweep's folder (outputs/multiruns/<time>): nothing was written")


def collect(sweep_dir: Path) -> tuple[list[JobResult], list[str]]:
    """The sweep's jobs in launch order, a "missing" one per planned job whose folder is not there; its overrides."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise NoResultsError(f"{sweep_dir} is not a folder: give the sweep folder (hydra.sweep.dir) of a study")
    job_dirs = sorted((p.parent.parent for p in sweep_dir.glob("**/.hydra/config.yaml")
                       if p.parent.parent != sweep_dir),
                      key=_job_order)
    multirun = sweep_dir / MULTIRUN
    for job_dir in job_dirs:  # a sweep folder is data: it names only the callables the project does (run_contents)
        check_run_files(job_dir, upgrade=sweep_dir)
    if multirun.is_file():
        check_record(OmegaConf.load(multirun), multirun)
    jobs = [read_job(job_dir, sweep_dir) for job_dir in job_dirs]
    name_variants(jobs)
    overrides = recorded_overrides(multirun)  # Hydra's: the command-line overrides the sweep ran with
    jobs += missing_jobs(jobs, overrides)
    if not any(job.status in ("completed", "failed") for job in jobs):
        found = f"{len(job_dirs)} job folders, none with a summary.json" if job_dirs else "no job folders"
        raise NoResultsError(f"no results in {sweep_dir}: {found}. Give the folder of a sweep "
                             f"(python sweep.py ..., or python train.py -m ...) whose jobs have finished.")
    return jobs, overrides


def name_variants(jobs: list[JobResult]) -> None:
    """Each job's variant: the corpus, training window, lr, recipe, probe and seed that vary among its model's runs
    in one training mode (a setting of several trainings has no seed of its own: its runs' seeds do not name it)."""
    for group in group_by(jobs, lambda job: (job.name, job.training_mode)).values():
        # what varies among its completed runs: a job not completed lacks what only a summary says (its window, ...)
        # and would otherwise name a setting of its own ("astra_alpha (window None)")
        done = [job for job in group if job.status == "completed"] or group
        varies = [key for key in ("corpus", "seq_len", "lr", "optim", "probe", "seed")
                  if key != "seed" or all(job.n == 1 for job in done)
                  if len({str(job.values.get(key)) for job in done}) > 1]
        for job in group:
            job.variant = ", ".join(_variant(job, key) for key in varies)


def _variant(job: JobResult, key: str) -> str:
    value = job.values.get(key)
    if key == "lr":
        return f"lr {value:g}" if isinstance(value, (int, float)) else f"lr {value}"
    if key == "corpus":
        return str(value)
    if key == "seq_len":  # streams: the BPTT chunk; windows: the window
        return f"window {value}"
    if key == "probe":
        return f"probe {value}" if value not in (None, "none") else "no probe"
    return f"{'recipe' if key == 'optim' else key} {value}"  # "recipe transformer", "seed 1"


def run_label(job: JobResult, jobs: list[JobResult]) -> str:
    """The job's label, with its training mode and window where another job has the same label."""
    return job.model if sum(other.model == job.model for other in jobs) < 2 else f"{job.name}, {job.training}"


# --- the ladder: models of several families side by side ----------------------------------
def ladder_jobs(jobs: list[JobResult]) -> list[JobResult]:
    done = [job for job in jobs if job.status == "completed"]
    return done if len({job.values.get("family") for job in done}) > 1 else []


def trainings(jobs) -> dict[str, dict[tuple, JobResult]]:
    """{model name: {(training mode, training window): job}}, in the order the models first appear; of twins
    of one training (a sweep's probe and no-probe runs), the later one."""
    found: dict[str, dict[tuple, JobResult]] = {}
    for job in jobs:
        found.setdefault(job.name, {})[(job.training_mode, job.training_window)] = job
    return found


def mode_pairs(jobs) -> list[tuple[JobResult, JobResult]]:
    """(windows job, streams job) of each model trained both ways at one training window."""
    return [(runs[("windows", window)], runs[("streams", window)]) for runs in trainings(jobs).values()
            for mode, window in runs if mode == "windows" and ("streams", window) in runs]
