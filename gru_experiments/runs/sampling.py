"""python sample.py: sampling, evaluate=true, stats=true and explore=true (docs/outputs.md, docs/explore.md)."""

from __future__ import annotations

import contextlib
import re
import time
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path

import torch

from gru_experiments.data.recall_probe import (
    Pairs,
    ProbeSettings,
    SymbolIds,
    plant,
    planting_generator,
    probe_symbols,
)
from gru_experiments.data.tokenizers import encode_prompt
from gru_experiments.errors import UserError
from gru_experiments.files import atomic_write, utf8_text, write_json
from gru_experiments.models.devices import resolve_device
from gru_experiments.runs.run_dir import EXPLORE, RunDir, display_path
from gru_experiments.runs.sample_checks import SampleSpec
from gru_experiments.runs.trained_run import Splits, TrainedRun, load
from gru_experiments.study.dynamic import adapted_to, gradient_statistics, statistics_ids
from gru_experiments.study.explore import PlantedText, explore
from gru_experiments.study.explore_page import render_page
from gru_experiments.study.generation import (
    NO_PROGRESS,
    STUDY_PROMPTS,
    Progress,
    check_generation_fits,
    sample_texts,
    validate_sampling,
)
from gru_experiments.study.modes import DYNAMIC, STATEFUL, WINDOWED
from gru_experiments.study.text_index import TrainingIndex
from gru_experiments.study.text_protocol import TextSettings, format_text_statistics, measure_text

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape(text: str) -> str:
    r"""Decode \n, \t and \\ so that one line (or one command-line value) can hold a multi-line prompt."""
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], text)


def read_prompts(prompt=None, prompt_file: str | None = None) -> list[str]:
    """`prompt` (a string or a list), or `prompt_file`'s non-empty lines (escapes decoded), else the study's."""
    if prompt is not None and prompt_file:
        raise UserError("give prompt=... or prompt_file=..., not both")
    if prompt_file:
        prompts = [unescape(line) for line in read_text_file(prompt_file, "prompt_file").splitlines() if line]
        if not prompts:
            raise UserError(f"no prompts in {prompt_file} (one per line)")
        return prompts
    if prompt is None:
        return list(STUDY_PROMPTS)
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not prompts:
        raise UserError("prompt=[] gives no prompt to sample from: give one (prompt='ROMEO: '), a list, or "
                        "prompt_file=FILE; leave prompt out for the study's three")
    return [unescape(str(p)) for p in prompts]


def read_text_file(name, key: str) -> str:
    """The UTF-8 text of the file `key` names (prompt_file, explore_file); else one line saying what is wrong."""
    path = Path(str(name)).expanduser()
    if path.is_dir():
        raise UserError(f"{key}={name} is a directory: give a UTF-8 text file")
    if not path.is_file():
        raise UserError(f"{key} not found: {name}")
    try:
        return utf8_text(path.read_bytes())
    except ValueError as error:
        raise UserError(f"{key}={name} is not UTF-8 text: {error}") from None


def load_run(spec: SampleSpec, checkpoint: Path, reads_corpus: bool) -> TrainedRun:
    """sample.py's checkpoint through trained_run.load, with its run's data settings (else the command's: with
    reads_corpus, only a corpus the command line names) and evaluation group (the command line's on top)."""
    device = resolve_device(spec.device)
    folder = own = RunDir.of_checkpoint(checkpoint)
    if spec.run is not None:  # ckpt= of another run beside it is refused, as train.py's resume= beside ckpt_path=
        folder = RunDir(spec.run)
        if spec.ckpt is not None and own is not None and own.path != folder.path.resolve():
            raise UserError(f"ckpt={spec.ckpt} is a checkpoint of the run {display_path(own.path)}, but run={spec.run} "
                            "names another run: give one of them (run= samples its last checkpoint)")
    if spec.cpu_threads:
        torch.set_num_threads(spec.cpu_threads)
    trained = load(checkpoint, device, folder=folder, seed=spec.seed)
    if trained.data is None:
        if reads_corpus and not spec.data_named:
            where = f"{display_path(folder.config_file)} is missing" if folder else "the checkpoint has no run folder"
            raise UserError(f"the corpus the model trained on is unknown ({where}, and the checkpoint does not name "
                            "it): give it with data.path=FILE (data.path=null: Tiny Shakespeare), and data.seq_len if "
                            "the run's was not the default")
        trained.data = spec.data
    if trained.evaluation is None:
        trained.evaluation = spec.evaluation
    trained.evaluation = trained.evaluation_group(spec.evaluation_changes)
    trained.data_dir = spec.data_dir
    return trained


def sample(spec: SampleSpec, checkpoint: Path) -> dict:
    output_dir, mode = spec.output_dir, spec.mode
    raw_prompts = read_prompts(spec.prompt, spec.prompt_file)  # before the checkpoint is read
    trained = load_run(spec, checkpoint, reads_corpus=spec.evaluate or spec.stats)
    model, tokenizer, run = trained.model, trained.tokenizer, trained.folder

    validate_sampling({"top_k": spec.decoding.top_k}, tokenizer.vocab_size)  # its bound, the vocabulary known
    splits = splits_needed(spec, trained)
    # Prompts the vocabulary cannot spell are refused or, with drop_unknown=true, used without those characters.
    encoded = [encode_prompt(tokenizer, prompt, drop_unknown=spec.drop_unknown) for prompt in raw_prompts]
    prompts = [tokenizer.decode(ids) for ids in encoded]
    decoding, n, new_tokens = spec.decoding, spec.num_samples, spec.max_new_tokens
    window = trained.evaluation_settings().window if mode == WINDOWED else None
    adapting = prompt_adaptation(trained, mode, Progress(prefix="inference=dynamic"))  # adapts to each prompt
    sampled = STATEFUL if adapting else mode
    # A request too large for memory is refused before the first prompt's samples, not after them.
    check_generation_fits(model, max(map(len, encoded)), new_tokens, n, sampled, window)
    settings = dict(mode=mode, window=window, num_samples=n, max_new_tokens=new_tokens, **asdict(decoding),
                    seed=spec.seed, device=str(trained.device), dynamic=adapting and adapting.settings.record())

    print(f"checkpoint: {display_path(checkpoint)} ({trained.name}: {model.family}, "
          f"{tokenizer.kind} tokenizer)")
    print("settings: " + ", ".join(f"{k}={v}" for k, v in settings.items() if v is not None))
    results, lines = [], []
    for prompt, ids in zip(prompts, encoded):
        started = time.perf_counter()
        progress = Progress(prefix=f"sampling {shown_prompt(prompt)}")
        with contextlib.ExitStack() as adapted:
            if adapting:  # the weights adapted to the prompt (a bar of their own), then sampled statefully
                with progress.phase("the weights adapting to the prompt", max(len(ids) - 1, 0)) as tick:
                    adapted.enter_context(adapting(model, ids, tick))
            [texts] = sample_texts(model, tokenizer, [prompt], mode=sampled, max_new_tokens=new_tokens, num_samples=n,
                                   decoding=decoding, seed=spec.seed, window=window, progress=progress)
        seconds = time.perf_counter() - started
        results.append({"prompt": prompt, "samples": texts, "seconds": seconds,
                        "tokens_per_second": n * new_tokens / max(seconds, 1e-9)})
        for i, text in enumerate(texts, 1):
            lines += [f"=== {prompt!r} [{mode}, sample {i}/{len(texts)}]", text, ""]
    text_out = "\n".join(lines)
    print(text_out)

    atomic_write(output_dir / "samples.txt", text_out)  # the folder made with it
    record = {"checkpoint": str(Path(checkpoint).resolve()), "model": trained.name,
              "run_dir": str(run.path.resolve()) if run else None, "settings": settings,
              "seed": spec.seed, "prompts": prompts, "results": results}
    write_json(output_dir / "sampling.json", record)
    print(f"saved: {display_path(output_dir / 'samples.txt')}, {display_path(output_dir / 'sampling.json')}")

    return record | scored(spec, trained, splits)


class PromptAdaptation:
    """inference=dynamic's: the run's evaluation.dynamic settings (rms's statistics gathered once); called with
    `(model, ids, tick)`, the block inside which the weights are adapted to a prompt."""

    def __init__(self, trained: TrainedRun, progress: Progress = NO_PROGRESS):
        self.settings = s = trained.evaluation_settings().dynamic
        self.statistics = None
        if s.rule == "rms" and s.lr:
            train_ids = trained.splits().train_ids
            with progress.phase("rms statistics on the training split", len(statistics_ids(train_ids, s)) - 1) as tick:
                self.statistics = gradient_statistics(trained.model, train_ids, s, tick)

    def __call__(self, model, ids, tick=None):
        return adapted_to(model, torch.tensor(ids, dtype=torch.long, device=model.device), self.settings,
                          self.statistics, tick=tick)


def prompt_adaptation(trained: TrainedRun, mode: str, progress: Progress = NO_PROGRESS) -> PromptAdaptation | None:
    """inference=dynamic's adaptation (None in another mode); a counted model refuses it in one line."""
    if mode != DYNAMIC:
        return None
    if not trained.model.trainable:
        raise UserError(f"inference=dynamic adapts trained weights by their gradient: {trained.name} ("
                        f"{trained.model.family}) counts its weights; sample it stateful, stateless or windowed")
    return PromptAdaptation(trained, progress)


def scored(spec: SampleSpec, trained: TrainedRun, splits: Splits | None) -> dict:
    """evaluate=true's figures ("evaluation": evaluation.json) and stats=true's ("text": stats.json), those asked."""
    record = {}
    if spec.evaluate:
        record["evaluation"] = score_checkpoint(trained, splits, spec.output_dir)
    if spec.stats:
        record["text"] = measure_checkpoint_text(spec, trained, splits)
    return record


def splits_needed(spec: SampleSpec, trained: TrainedRun, always: bool = False) -> Splits | None:
    """The corpus evaluate=true or stats=true (`always`: explore=true) needs, read and checked before any sampling."""
    if not (always or spec.evaluate or spec.stats):
        return None
    splits = trained.splits()  # the corpus's sha256 checked against the checkpoint's, as a resume does
    if spec.evaluate or always:  # the windowed mode's window, as train.py checks it (checks.check_sizes)
        trained.evaluation_settings().check_window(splits.val_ids.numel() - 1)
    if spec.evaluate:
        trained.evaluation_settings().check_streams(splits.val_ids.numel() - 1)
    if spec.stats:
        check_stats_fit(text_settings(spec, trained), splits)
    return splits


def score_checkpoint(trained: TrainedRun, splits: Splits, output_dir: Path) -> dict:
    """Every inference mode and the context curve on the validation split, by the run's own plan: evaluation.json."""
    started = time.perf_counter()
    evaluation = trained.evaluate_validation(splits, progress=Progress())
    modes, *others = evaluation.descriptions()  # the modes', then every other entry's (the cache's)
    print(f"{display_path(splits.source)}: {modes}" + "".join(f"\n{other}" for other in others))
    figures = evaluation.summary()
    result = {"checkpoint": str(Path(trained.checkpoint).resolve()), "data": str(splits.source),
              "settings": figures.pop("mode_evaluation"), **figures, "seconds": time.perf_counter() - started}
    path = write_json(output_dir / "evaluation.json", result)
    print(f"saved: {display_path(path)}")
    return result


# --- stats=true: the text statistics --------------------------------------------------------------------
def text_settings(spec: SampleSpec, trained: TrainedRun) -> TextSettings:
    """stats=true's: the run's evaluation.text (this command's evaluation.* on top), seeded by this command."""
    return replace(trained.evaluation_settings().text, seed=spec.seed)


def check_stats_fit(settings: TextSettings, splits: Splits) -> None:
    n = len(splits.val_text)
    where = f"the validation split of {display_path(splits.source)} has {n:,} characters"
    if settings.chars > n:
        raise UserError(f"invalid evaluation.text.chars={settings.chars}: the reference is slices of the validation "
                        f"split as long as the samples, and {where}")
    if settings.drift_chars and settings.stretch_chars > n:
        raise UserError(f"the drift's reference is slices of {settings.stretch_chars} characters, and {where}; "
                        "turn the drift off with evaluation.text.drift_chars=0")


def measure_checkpoint_text(spec: SampleSpec, trained: TrainedRun, splits: Splits) -> dict:
    """The text statistics of the samples in every mode × decoder, printed and written to stats.json."""
    started = time.perf_counter()
    index = TrainingIndex.cached(splits.train_text, trained.data_dir)
    record = measure_text(trained.model, trained.tokenizer, index, splits.val_text, text_settings(spec, trained),
                          val_ids=splits.val_ids, progress=Progress(prefix="text statistics"))
    record = {"checkpoint": str(Path(trained.checkpoint).resolve()), "data": str(splits.source), **record,
              "seconds": time.perf_counter() - started}
    print(format_text_statistics(record))
    path = write_json(spec.output_dir / "stats.json", record)
    print(f"saved: {display_path(path)} ({record['seconds']:.1f} s)")
    return record


# --- explore=true: the run's page -----------------------------------------------------------------------
def explore_run(spec: SampleSpec, checkpoint: Path) -> dict:
    """The run's page (and evaluate=true's and stats=true's figures), its folder held meanwhile: a run still training
    holds it (RunFolderTaken)."""
    folder = RunDir(spec.run) if spec.run is not None else RunDir.of_checkpoint(checkpoint)
    with folder.hold("write its explore.html from a checkpoint of a run still training") if folder else nullcontext():
        trained = load_run(spec, checkpoint, reads_corpus=True)
        splits = splits_needed(spec, trained, always=True)
        page = write_explore_page(spec, trained, splits)
        return {"explore": page, **scored(spec, trained, splits)}


def explore_text(spec: SampleSpec, val_text: str) -> str:
    if spec.explore_text is not None:
        return unescape(spec.explore_text)
    if spec.explore_file:
        return read_text_file(spec.explore_file, "explore_file")
    if spec.explore_start >= len(val_text) - 1:
        raise UserError(f"invalid explore_start={spec.explore_start}: the validation split has {len(val_text):,} "
                        "characters")
    return val_text[spec.explore_start:spec.explore_start + spec.explore_chars]


def planted_text(probe: dict | None, corpus_text: str, ids: torch.Tensor, hold_ids: torch.Tensor, tokenizer,
                 seed: int) -> PlantedText | None:
    """The probe's pairs planted in ids when the run trained with it, and ⟪ k before hold_ids (never asked for)."""
    settings = ProbeSettings.from_config(probe) if probe else None
    if settings is None:
        return None
    symbols = SymbolIds.of(probe_symbols(corpus_text, settings.keys), tokenizer)
    pairs = settings.validation
    distances = [d for d in pairs.distances if 2 * pairs.gap + d + 4 <= ids.numel() // 4]
    if not distances:
        raise UserError(f"the text ({ids.numel()} tokens) is too short for a planted pair: give more explore_chars")
    planting = plant(ids, Pairs(distances, pairs.gap), symbols, planting_generator(seed, "explore", 0), cut=True)
    hold = torch.cat([torch.tensor([symbols.opening, int(symbols.keys[0])]), hold_ids])
    return PlantedText(planting, symbols.keys, hold)


def write_explore_page(spec: SampleSpec, trained: TrainedRun, splits: Splits) -> Path:
    started = time.perf_counter()
    model, tokenizer, run, checkpoint = trained.model, trained.tokenizer, trained.folder, trained.checkpoint
    text = explore_text(spec, splits.val_text)
    ids = torch.tensor(encode_prompt(tokenizer, text, drop_unknown=spec.drop_unknown), dtype=torch.long)
    if ids.numel() < 2:
        raise UserError("the text to explore needs at least two tokens")
    hold_ids = splits.val_ids[spec.explore_start:spec.explore_start + spec.explore_hold].cpu()
    probe = planted_text(trained.probe, splits.train_text + splits.val_text, ids, hold_ids, tokenizer, spec.seed)
    ids = probe.planting.ids if probe else ids
    data = explore(model, tokenizer, ids.to(model.device), seq_len=trained.seq_len,
                   window=trained.evaluation_settings().window, probe=probe)
    step = "" if trained.step is None else f" (step {trained.step:,})"  # a run may have trained on since
    data["title"] = {"model": (run.model_name() if run is not None else None) or Path(checkpoint).stem,
                     "checkpoint": display_path(checkpoint) + step,
                     "text": "explore_text" if spec.explore_text is not None else
                     (spec.explore_file or f"validation split, characters {spec.explore_start:,} to "
                      f"{spec.explore_start + len(text):,}"), "planted": probe is not None}
    path = run.explore_file if run is not None else spec.output_dir / EXPLORE
    atomic_write(path, render_page(data))
    print(f"saved: {display_path(path)} ({path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - started:.1f} s): "
          + ", ".join(f"{mode} {bpc:.4f}" for mode, bpc in data["bpc"].items()) + " bits per character")
    return path


def shown_prompt(prompt: str, limit: int = 40) -> str:
    """A prompt as a progress bar's label shows it: repr'd, cut to `limit` characters with its length said."""
    return repr(prompt) if len(prompt) <= limit else f"{prompt[:limit]!r}... ({len(prompt):,} characters)"
