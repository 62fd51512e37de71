"""One trained run, one way in (`load`: the API, sample.py, the best checkpoint) and one evaluation door (`evaluate`:
every figure of the project). docs/internals.md, *The way through a run*."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from omegaconf import OmegaConf

from gru_experiments.data.corpus import corpus_path, read_corpus_bytes, read_corpus_text, scored_split, split_parts
from gru_experiments.errors import UserError
from gru_experiments.runs.run_contents import check_run
from gru_experiments.runs.run_dir import RunDir
from gru_experiments.runs.task import load_checkpoint
from gru_experiments.study.evaluation import DEFAULT_EVALUATION, Evaluation, EvaluationSettings, plan_for
from gru_experiments.study.evaluation import evaluate as evaluate_plan
from gru_experiments.study.generation import NO_PROGRESS
from gru_experiments.study.plan import FINAL, TEXT, Request
from gru_experiments.study.scores import Split
from gru_experiments.study.text_index import TrainingIndex


class Splits(NamedTuple):
    """The corpus the model trained on, split as it was: texts and token ids."""
    source: Path
    train_text: str
    val_text: str
    train_ids: torch.Tensor
    val_ids: torch.Tensor
    test_ids: torch.Tensor | None = None  # where the run's data.test_fraction holds a test split out


@dataclass
class TrainedRun:
    """Trained weights with their tokenizer and what their run folder recorded (`checkpoint` None: weights in memory,
    at the end of training). `seed` seeds the evaluation's sampled parts (the text statistics, the recall planting)."""
    model: object
    tokenizer: object
    name: str
    checkpoint: Path | None = None
    folder: RunDir | None = None
    data: dict | None = None  # the run's data group (its recorded config); None: not recorded
    evaluation: dict | None = None  # the run's evaluation group; None: not recorded
    seed: int = 0
    data_dir: Path | None = None  # where the text statistics' training index is cached (paths.data_dir)
    probe: dict | None = None  # the run's probe group (probe=recall: explore=true plants its pairs); None: none
    corpus_sha256: str | None = None  # the text its checkpoint trained on (None: unrecorded, or weights in memory)
    step: int | None = None  # the training step of its checkpoint (None: unrecorded)

    @property
    def device(self):
        return self.model.device

    @property
    def seq_len(self) -> int | None:
        """The training window: the recorded data.seq_len, else the one its summary's evaluation records."""
        if self.data and self.data.get("seq_len"):
            return int(self.data["seq_len"])
        seq_len = ((self.summary() or {}).get("mode_evaluation") or {}).get("seq_len")
        return int(seq_len) if seq_len else None

    def summary(self) -> dict | None:
        return self.folder.summary() if self.folder is not None else None

    @property
    def training_tokens(self) -> int | None:
        """What evaluation.budget is a multiple of (summary.json's train_tokens); None: every figure exact."""
        return (self.summary() or {}).get("train_tokens")

    def evaluation_group(self, changes: dict | None = None) -> dict:
        """The run's evaluation group (else conf/evaluation/default.yaml), `changes` (dotted keys) on top."""
        group = OmegaConf.create(self.evaluation if self.evaluation is not None else
                                 OmegaConf.to_container(OmegaConf.load(DEFAULT_EVALUATION)))
        for key, value in (changes or {}).items():
            OmegaConf.update(group, key, value, merge=False)
        return OmegaConf.to_container(group)

    def evaluation_settings(self, changes: dict | None = None, seq_len: int | None = None) -> EvaluationSettings:
        """The plan's settings the run was scored by, `changes` on top, at its training window (else `seq_len`)."""
        seq_len = self.seq_len or seq_len
        if seq_len is None:
            raise UserError(f"{self.checkpoint}: its training window (data.seq_len) is unknown: no run config "
                            "records it; give the run folder, or data.seq_len")
        return EvaluationSettings.of(self.evaluation_group(changes), seq_len)

    def splits(self) -> Splits:
        """The corpus it trained on (its recorded data settings), split as it was."""
        data = self.data
        if data is None:
            raise UserError(f"the corpus {self.name} trained on is unknown: its run folder records no config")
        source = corpus_path(data["path"], data["url"], data.get("sha256"), data["cache_dir"])
        if self.tokenizer.kind == "byte":  # its bytes as they are, as its ids were prepared (no UTF-8 check)
            raw = read_corpus_bytes(source)
            sha256, parts = hashlib.sha256(raw).hexdigest(), split_parts(raw, data)
            ids = [torch.frombuffer(bytearray(part), dtype=torch.uint8).long().to(self.device) for part in parts]
            texts = [part.decode("utf-8", errors="replace") for part in parts]
        else:
            corpus = read_corpus_text(source)
            sha256, texts = corpus.sha256, split_parts(corpus.text, data)
        if self.corpus_sha256 is not None and sha256 != self.corpus_sha256:  # as a resume refuses it
            raise UserError(f"the corpus changed since {self.name} trained on it: {source} has sha256 {sha256}, "
                            f"but checkpoint {self.checkpoint} was trained on sha256 {self.corpus_sha256}; its figures "
                            "would score another text: restore that text")
        if self.tokenizer.kind != "byte":
            try:
                ids = [torch.tensor(self.tokenizer.encode(t), dtype=torch.long, device=self.device) for t in texts]
            except ValueError as error:
                raise UserError(f"{source} does not fit the model's vocabulary: {error}") from None
        return Splits(source, *texts[:2], *ids[:2], ids[2] if data.get("test_fraction") else None)

    def evaluate_validation(self, splits: Splits, changes: dict | None = None, progress=NO_PROGRESS,
                            half: str | None = None) -> Evaluation:
        """The scored split (evaluation.split), or its `half`, by the run's own plan, `changes` on top, the text
        statistics left to stats=true: evaluate=true's and the API's figures."""
        settings = self.evaluation_settings(changes)
        scored = scored_split(settings.split, splits.val_ids, splits.test_ids, splits.source)
        return evaluate(self, settings, Split.of(validation_half(scored, half), self.tokenizer),
                        training_tokens=self.training_tokens, train_ids=splits.train_ids, skip=(TEXT,),
                        progress=progress)


HALVES = ("first", "second")


def validation_half(ids: torch.Tensor, half: str | None) -> torch.Tensor:
    """The split's ids (half None), or those of its first n // 2 targets, or of the rest (the id before them context
    only): where the dynamic study tunes and where it reports (docs/evaluation.md, *Dynamic evaluation*)."""
    if half is None:
        return ids
    if half not in HALVES:
        raise UserError(f"invalid half={half!r}: give first or second (of the validation split's targets), or none")
    n = max(ids.numel() - 1, 0)
    if n < 4:
        raise UserError(f"the validation split has {n} target(s): too few to halve")
    return ids[: n // 2 + 1] if half == "first" else ids[n // 2:]


def load(checkpoint: Path, device="cpu", *, folder: RunDir | None = None, seed: int | None = None,
         own_run: bool = False) -> TrainedRun:
    """The checkpoint's weights and tokenizer on `device`, in eval mode, with what its run folder (`folder`, else the
    checkpoint's own) recorded; a folder that names a foreign callable is refused first (run_contents), but this
    process's own run's (`own_run`)."""
    task = load_checkpoint(checkpoint, map_location=device)  # weights only; its class the package's
    folder = folder if folder is not None else RunDir.of_checkpoint(checkpoint)
    if folder is not None and not own_run:
        check_run(folder)
    model = task.model.to(device).eval()
    config = folder.config() if folder is not None else None
    recorded = {}
    for key in ("data", "evaluation", "paths.data_dir", "seed", "probe") if config is not None else ():
        try:
            node = OmegaConf.select(config, key, throw_on_resolution_failure=True)
            recorded[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        except Exception:  # noqa: BLE001 - a group that resolves only inside its run (${hydra:...}) is left out
            continue
    name = task.hparams.get("model_name") or (folder.model_name() if folder else None) or Path(checkpoint).stem
    data_dir = recorded.get("paths.data_dir")
    return TrainedRun(model, task.tokenizer, name, Path(checkpoint), folder, recorded.get("data"),
                      recorded.get("evaluation"), seed if seed is not None else int(recorded.get("seed") or 0),
                      Path(data_dir) if data_dir else None, recorded.get("probe"), task.corpus_sha256,
                      task.trained_steps)


def evaluate(run: TrainedRun, settings: EvaluationSettings, val: Split, *, skip: tuple[str, ...] = (), plan=None,
             progress=NO_PROGRESS, **asked) -> Evaluation:
    """The evaluation door: `run`'s weights scored on `val` by the plan of `settings` (`asked`: `request`'s)."""
    return evaluate_plan(request(run, settings, val, **asked), plan, progress, skip)


def request(run: TrainedRun, settings: EvaluationSettings, val: Split, *, training_tokens: int | None,
            purpose: str = FINAL, train_ids=None, probe=None, load_text_index=None) -> Request:
    """The evaluation Request of `run` within the budget of `training_tokens` (None: every figure exact)."""
    def index():
        return TrainingIndex.cached(run.tokenizer.decode(train_ids), run.data_dir or Path("data"))
    return Request(run.model, val, settings, training_tokens, purpose, run.tokenizer, train_ids, probe, run.seed,
                   load_text_index or index)


def plan(run: TrainedRun, settings: EvaluationSettings, val: Split, **asked):
    """What `evaluate` with the same arguments runs (study/evaluation.plan_for): to describe or price it first."""
    return plan_for(request(run, settings, val, **asked))
