"""The Python API: train a model, load it, generate and score text in the study's inference modes, through the
scripts' own code (no second implementation); bad input raises a one-line UserError. docs/python.md."""

import contextlib
import logging
import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

from gru_experiments.errors import UserError
from gru_experiments.study.modes import DYNAMIC, MODES, STATEFUL, WINDOWED

# The Hydra configs train.py composes: conf/ beside the package (an editable install or a checkout).
CONF = Path(__file__).resolve().parent.parent / "conf"
REPO = CONF.parent


def _check_mode(mode: str, model=None, dynamic: dict | None = None) -> str:
    if mode not in (*MODES, DYNAMIC):
        raise UserError(f"unknown inference mode {mode!r}: choose one of {', '.join((*MODES, DYNAMIC))}")
    if dynamic and mode != DYNAMIC:
        raise UserError(f"{', '.join(sorted(dynamic))} set the dynamic mode's settings; give mode=\"dynamic\" too")
    if mode == DYNAMIC and model is not None and not model.trainable:
        raise UserError(f"dynamic evaluation adapts trained weights by their gradient: this {model.family} model's "
                        "weights are counted, not learned; score it stateful, stateless or windowed")
    return mode


# --- scoring ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TextScore:
    """How well a model predicts a text in one inference mode (every token but the first predicted)."""
    mode: str
    nll: float  # mean negative log-likelihood per predicted token, in nats
    bpc: float  # bits per character: nll_sum / (characters * ln 2)
    nll_sum: float  # total, in nats
    tokens: int  # tokens predicted (the text's tokens minus the first)
    characters: int  # characters those tokens decode to
    window: int | None = None  # the windowed mode's context, in tokens
    dynamic: dict | None = None  # the dynamic mode's settings (evaluation.dynamic's keys)

    def to_dict(self) -> dict:
        return asdict(self)


# --- a trained model ---------------------------------------------------------------------------
class TrainedModel:
    """A trained model with its tokenizer, ready to generate and score text: runs/trained_run.TrainedRun's face."""

    def __init__(self, run):
        self.run = run  # runs/trained_run.TrainedRun

    model = property(lambda self: self.run.model)
    tokenizer = property(lambda self: self.run.tokenizer)
    name = property(lambda self: self.run.name)
    checkpoint = property(lambda self: self.run.checkpoint)
    run_dir = property(lambda self: self.run.folder.path if self.run.folder is not None else None)
    seq_len = property(lambda self: self.run.seq_len)  # the training window (data.seq_len), where recorded
    device = property(lambda self: self.run.device)

    def __repr__(self) -> str:
        where = self.run_dir if self.run_dir is not None else self.checkpoint
        return (f"TrainedModel({self.name!r}: {self.model.family}, {self.tokenizer.kind} tokenizer, "
                f"vocabulary {self.tokenizer.vocab_size}, seq_len {self.seq_len}, from {str(where)!r})")

    @property
    def summary(self) -> dict | None:
        """The run's summary.json, when the model came from a finished run."""
        from gru_experiments.report.sweep_folder import read_summary

        summary = self.run.summary()
        return None if summary is None else read_summary(summary)

    def _window(self, window: int | None) -> int:
        if window is None:
            window = self.seq_len
        if window is None:
            raise UserError(f"windowed mode needs window=N: {self.checkpoint} has no run config recording "
                            "the training window (data.seq_len)")
        return window

    def generate(self, prompt: str, mode: str = STATEFUL, *, max_new_tokens: int = 500, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, greedy: bool = False, seed: int = 1234,
                 num_samples: int | None = None, window: int | None = None,
                 drop_unknown: bool = False, **dynamic) -> str | list[str]:
        """The prompt and a continuation of `max_new_tokens` tokens sampled in `mode` (a list of `num_samples` texts
        when it is given), decoded as sample.py does; mode="dynamic" adapts the weights to the prompt first
        (`dynamic`: evaluation.dynamic's keys). docs/python.md."""
        from gru_experiments.data.tokenizers import encode_prompt, plain_tokens
        from gru_experiments.study.generation import Decoding, generate, validate_sampling

        _check_mode(mode, self.model, dynamic)
        if mode == WINDOWED:
            window = self._window(window)
        settings = {"temperature": temperature, "top_k": top_k, "top_p": top_p,
                    "num_samples": 1 if num_samples is None else num_samples, "max_new_tokens": max_new_tokens,
                    "window": window, "seed": seed, "greedy": greedy}
        validate_sampling({k: v for k, v in settings.items() if v is not None}, self.tokenizer.vocab_size)
        if not isinstance(prompt, str):
            raise UserError(f"the prompt must be a string, got {type(prompt).__name__}")
        # As sample.py: the prompt as the vocabulary spells it (a UserError names unknown characters).
        prompt = self.tokenizer.decode(encode_prompt(self.tokenizer, prompt, drop_unknown=drop_unknown,
                                                     option="drop_unknown=True"))
        decoding = Decoding(temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy)
        ids = encode_prompt(self.tokenizer, prompt)
        with self._adapted(ids, mode, dynamic):
            generated = generate(self.model, ids, mode=STATEFUL if mode == DYNAMIC else mode,
                                 max_new_tokens=max_new_tokens, num_samples=settings["num_samples"],
                                 decoding=decoding, seed=seed, window=window if mode == WINDOWED else None,
                                 plain=plain_tokens(self.tokenizer))
        texts = [prompt + self.tokenizer.decode(row) for row in generated.tolist()]
        return texts[0] if num_samples is None else texts

    def _training_ids(self, settings):
        """The training split's ids rms gathers its statistics on (None for sgd, and for lr = 0: no step)."""
        if settings.rule != "rms" or settings.lr == 0:
            return None
        if self.run.data is None:
            raise UserError(f"rule='rms' gathers its statistics on the training split, but {self.checkpoint} has no "
                            "run config naming its corpus: give rule='sgd' (with its lr), or load the run folder")
        return self.run.splits().train_ids

    @contextlib.contextmanager
    def _adapted(self, ids, mode: str, changes: dict):
        """The weights adapted to `ids` inside the block in mode "dynamic", else as they are."""
        import torch

        from gru_experiments.study.dynamic import adapted_to, gradient_statistics

        if mode != DYNAMIC:
            yield
            return
        settings = self.run.evaluation_settings({f"dynamic.{k}": v for k, v in changes.items()},
                                                seq_len=self.seq_len or 256).dynamic
        train_ids = self._training_ids(settings)  # rms's statistics gathered there (None for sgd)
        statistics = None if train_ids is None else gradient_statistics(self.model, train_ids, settings)
        with adapted_to(self.model, torch.tensor(ids, dtype=torch.long, device=self.device), settings, statistics):
            yield

    def score(self, text: str, mode: str = STATEFUL, *, window: int | None = None, **dynamic) -> TextScore:
        """The text's nats per token and bits per character in `mode`, every target exact, through the evaluation
        door (runs/trained_run.evaluate); `dynamic`: evaluation.dynamic's keys, by default the run's. docs/python.md."""
        import torch

        from gru_experiments.data.tokenizers import describe_characters
        from gru_experiments.runs.trained_run import evaluate
        from gru_experiments.study.generation import validate_sampling
        from gru_experiments.study.plan import BEST, OVER_TRAINING
        from gru_experiments.study.scores import Split

        _check_mode(mode, self.model, dynamic)
        if mode == WINDOWED:
            window = self._window(window)
            validate_sampling({"window": window}, self.tokenizer.vocab_size)
        if not isinstance(text, str):
            raise UserError(f"the text must be a string, got {type(text).__name__}")
        if unknown := self.tokenizer.unknown_characters(text):
            raise UserError(f"the text has characters this model's {self.tokenizer.kind} vocabulary lacks: "
                            f"{describe_characters(unknown)}")
        ids = torch.tensor(self.tokenizer.encode(text), dtype=torch.long, device=self.device)
        if ids.numel() < 2:
            raise UserError(f"the text is {ids.numel()} token(s) long; scoring needs at least 2 "
                            "(the first is context only)")
        if mode == DYNAMIC:
            return self._score_dynamic(Split.of(ids, self.tokenizer), dynamic)
        settings = self.run.evaluation_settings({"budget": None, "streams": 1, "window": window, "text.samples": 0},
                                                seq_len=self.seq_len or 256)
        # stateful and stateless: the modes over training's plan (no windowed pass); windowed: the best's (no curve)
        evaluation = evaluate(replace(self.run, tokenizer=None), settings, Split.of(ids, self.tokenizer),
                              training_tokens=None, purpose=BEST if mode == WINDOWED else OVER_TRAINING)
        result = evaluation.modes.scores[mode]
        return TextScore(mode=mode, nll=result.nll, bpc=result.bpc, nll_sum=result.nll_sum, tokens=result.tokens,
                         characters=result.characters, window=window if mode == WINDOWED else None)

    def _score_dynamic(self, split, changes: dict) -> TextScore:
        """score(mode="dynamic"): the dynamic evaluation's own plan, one stream, every target exact."""
        from gru_experiments.runs.trained_run import evaluate

        settings = self.run.evaluation_settings({"budget": None, "streams": 1, "text.samples": 0} | {
            f"dynamic.{k}": v for k, v in changes.items()}, seq_len=self.seq_len or 256)
        train_ids = self._training_ids(settings.dynamic)
        record = evaluate(replace(self.run, tokenizer=None), settings, split, training_tokens=None,
                          purpose=DYNAMIC, train_ids=train_ids).results[DYNAMIC]
        if record["bpc"] is None:
            raise UserError(f"dynamic evaluation of the text {record['note']}")
        return TextScore(mode=DYNAMIC, nll=record["nll"], bpc=record["bpc"], nll_sum=record["nll_sum"],
                         tokens=record["targets"], characters=record["characters"], dynamic=record["settings"])

    def evaluate(self, *, progress: bool = False, half: str | None = None, **changes) -> dict:
        """The run's validation split scored by the plan it was scored by at the end of its training, `changes` on
        top: summary.json's figures to the last digit; `half`: "first" or "second". docs/python.md."""
        from gru_experiments.study.generation import Progress

        return self.run.evaluate_validation(self.run.splits(), changes, Progress(enabled=progress),
                                            half=half).summary()


def load(run_or_checkpoint, *, device: str = "cpu") -> TrainedModel:
    """A trained model and its tokenizer from a run folder (its last checkpoint), a checkpoint file, or
    the summary dict `train` returns, read with weights_only=True. device: "cpu", "cuda", "auto", ..."""
    from gru_experiments.runs.run_dir import RunDir, find_checkpoint

    if isinstance(run_or_checkpoint, dict):  # train()'s summary
        if not run_or_checkpoint.get("run_dir"):
            raise UserError("load() takes a run folder, a checkpoint file or train()'s summary (with run_dir)")
        run_or_checkpoint = run_or_checkpoint["run_dir"]
    if not isinstance(run_or_checkpoint, (str, os.PathLike)):
        raise UserError(f"load() takes a run folder or a checkpoint file, got {type(run_or_checkpoint).__name__}")
    path = Path(run_or_checkpoint).expanduser()
    if path.is_file():
        checkpoint, folder = find_checkpoint("", ".", ckpt=str(path)), None
    elif path.is_dir():
        checkpoint, folder = find_checkpoint("", ".", run=str(path)), RunDir(path.resolve())
    else:
        raise UserError(f"no run folder or checkpoint file at {run_or_checkpoint}")

    from gru_experiments.models.devices import resolve_device
    from gru_experiments.runs import trained_run

    device = resolve_device(device)  # a name torch does not know, or a device this machine lacks: one line
    return TrainedModel(trained_run.load(Path(checkpoint).resolve(), device, folder=folder))


# --- training --------------------------------------------------------------------------------
def train(overrides: Sequence[str] | None = None, *, root: str | os.PathLike | None = None) -> dict:
    """Train one model as `python train.py OVERRIDES...` does (the same run folder and files) and return its
    summary (summary.json). root: paths.root_dir (default $PROJECT_ROOT, else the checkout)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from gru_experiments.runs.jobs import one_line

    if isinstance(overrides, str):
        raise UserError(f"train() takes a list of overrides, e.g. [{overrides!r}], not a string")
    overrides = [str(o) for o in (overrides or [])]
    if not (CONF / "train.yaml").is_file():
        raise UserError(f"the Hydra configs are not at {CONF}; install the project from its checkout "
                        "(pip install -e .)")
    if GlobalHydra.instance().is_initialized():
        raise UserError("train() composes its own config; call it outside a Hydra app or initialize() block")
    given = list(overrides)
    if root is not None:
        root = str(Path(root).expanduser().resolve())
        if not re.fullmatch(r"[\w./\-]+", root):  # quoted only where a plain path would not parse
            root = "'" + root.replace("\\", "\\\\").replace("'", "\\'") + "'"
        overrides.append(f"paths.root_dir={root}")
    else:
        os.environ.setdefault("PROJECT_ROOT", str(REPO))  # as train.py
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="train"):
            config = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as error:
        reason = one_line(str(error).split("Config search path")[0])  # Hydra's search path says nothing here
        raise UserError(f"the overrides {given} do not compose: {reason}") from None
    return _run_job(config)


def _run_job(config) -> dict:
    """Hydra's own run_job, as train.py's: the run folder and HydraConfig set (paths.output_dir is
    ${hydra:runtime.output_dir}; train() records its .hydra/); train.log written by `_job_log`."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobStatus, run_job
    from hydra.types import HydraContext, RunMode
    from omegaconf import open_dict, read_write

    from gru_experiments.runs.jobs import discard_untouched_run_dir, job  # run_dir's resolvers: the folder's name

    def task(task_cfg) -> dict:
        from gru_experiments.runs.training import train as train_run

        with _job_log(Path(HydraConfig.get().runtime.output_dir) / f"{config.hydra.job.name}.log"):
            try:
                with job(task_cfg, record=True) as current:  # the run's one job, as train.py's
                    return train_run(task_cfg, current)
            except UserError as error:
                discard_untouched_run_dir(task_cfg.paths.log_dir, error)  # input errors leave no run folder
                raise

    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.mode = RunMode.RUN
    ran = run_job(task, config, "hydra.run.dir", None, HydraContext(None, Callbacks(config)), configure_logging=False)
    if ran.status == JobStatus.FAILED:  # raised as it is (JobReturn.return_value would print a line first)
        raise ran._return_value
    return ran.return_value


@contextlib.contextmanager
def _job_log(path: Path):
    """train.log in Hydra's format for the run's duration: on the root logger, and on Lightning's when they
    do not propagate; the caller's own logging is left alone."""
    handler = logging.FileHandler(path, delay=True, encoding="utf-8")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    loggers = [logging.getLogger()] + [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")
                                       if not logging.getLogger(name).propagate]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        handler.close()
