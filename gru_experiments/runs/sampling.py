"""python sample.py: generate from a checkpoint in one inference mode (samples.txt, sampling.json); evaluate=true
scores the validation split (evaluation.json), stats=true measures the text (stats.json). docs/outputs.md.
explore=true writes the run's page instead, explore.html (study/explore.py, docs/explore.md), of explore_text=,
explore_file= or a slice of the validation split; a probe run's with the probe's pairs planted.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import NamedTuple

import torch
from omegaconf import DictConfig, OmegaConf

from gru_experiments.data.corpus import corpus_path, read_corpus, split_text
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
from gru_experiments.runs.scoring import run_request
from gru_experiments.runs.task import load_checkpoint
from gru_experiments.study.evaluation import EvaluationSettings, evaluate
from gru_experiments.study.explore import PlantedText, explore
from gru_experiments.study.explore_page import render_page
from gru_experiments.study.generation import (
    STUDY_PROMPTS,
    Decoding,
    Progress,
    check_generation_fits,
    sample_texts,
    validate_sampling,
)
from gru_experiments.study.plan import TEXT
from gru_experiments.study.scores import Split
from gru_experiments.study.text_index import TrainingIndex
from gru_experiments.study.text_protocol import TextSettings, format_text_statistics, measure_text
from gru_experiments.validation import Rule, check_rules, int_at_least

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
    if not path.is_file():
        raise UserError(f"{key} not found: {name}")
    try:
        return utf8_text(path.read_bytes())
    except ValueError as error:
        raise UserError(f"{key}={name} is not UTF-8 text: {error}") from None


# sample.py's own keys, checked before the checkpoint is read (the sampling settings: generation.validate_sampling)
SAMPLE_RULES = [
    *(Rule(key, lambda v: isinstance(v, bool), "true or false", may_be_absent=True)
      for key in ("evaluate", "stats", "explore")),
    Rule("cpu_threads", int_at_least(1), "null (torch's default) or an integer >= 1", optional=True),
]


def sampled_run(cfg: DictConfig, checkpoint: Path) -> RunDir | None:
    """The run whose config and summary go with the checkpoint: run=, else the checkpoint's own folder. ckpt= of one
    run beside run= of another is refused (as train.py refuses resume= and ckpt_path= of two runs)."""
    own = RunDir.of_checkpoint(checkpoint)
    if not cfg.get("run"):
        return own
    run = RunDir(Path(cfg.run).expanduser())
    if cfg.get("ckpt") and own is not None and own.path.resolve() != run.path.resolve():
        raise UserError(f"ckpt={cfg.ckpt} is a checkpoint of the run {display_path(own.path)}, but run={cfg.run} names "
                        "another run: give one of them (run= samples its last checkpoint)")
    return run


def training_data_settings(run: RunDir | None, fallback: DictConfig, reads_corpus: bool = False) -> DictConfig:
    """The data settings the run trained with (its saved config), else `fallback`; with reads_corpus, only a corpus
    the command line names (a checkpoint names none), never the default in the run's place."""
    config = run.config() if run is not None else None
    if config is not None and "data" in config:
        try:
            return OmegaConf.create(OmegaConf.to_container(config.data, resolve=True))
        except Exception:  # an interpolation that only resolves inside that run (e.g. ${hydra:...})
            pass
    from hydra.core.hydra_config import HydraConfig

    if reads_corpus and HydraConfig.initialized() and not any(
            str(o).lstrip("+~").startswith("data.") for o in HydraConfig.get().overrides.task):
        where = f"{display_path(run.config_file)} is missing" if run else "the checkpoint has no run folder"
        raise UserError(f"the corpus the model trained on is unknown ({where}, and the checkpoint does not name it): "
                        "give it with data.path=FILE (data.path=null: Tiny Shakespeare), and data.seq_len if the "
                        "run's was not the default")
    return fallback


def load_run(cfg: DictConfig, checkpoint: Path, reads_corpus: bool):
    """sample.py's checkpoint on cfg.device (in eval mode), with its run (run=, else the checkpoint's folder)
    and the data settings it trained with: (task, device, run, data settings)."""
    check_rules(cfg, SAMPLE_RULES)
    device = resolve_device(cfg.device)
    run = sampled_run(cfg, checkpoint)
    if cfg.get("cpu_threads"):
        torch.set_num_threads(cfg.cpu_threads)
    task = load_checkpoint(checkpoint, map_location=device)
    task.model.to(device).eval()
    return task, device, run, training_data_settings(run, cfg.data, reads_corpus=reads_corpus)


def sample(cfg: DictConfig, checkpoint: Path) -> dict:
    output_dir = Path(cfg.paths.output_dir)
    mode = cfg.inference.mode
    validate_sampling(cfg, vocab_size=None)  # the settings before the checkpoint is read
    validate_stats(cfg)
    raw_prompts = read_prompts(cfg.get("prompt"), cfg.get("prompt_file"))
    task, device, run, data_cfg = load_run(cfg, checkpoint, reads_corpus=cfg.evaluate or bool(cfg.get("stats")))
    model, tokenizer = task.model, task.tokenizer

    validate_sampling({"top_k": cfg.top_k}, tokenizer.vocab_size)  # its bound, now that the vocabulary is known
    splits = splits_needed(cfg, data_cfg, tokenizer, device)
    # Prompts the vocabulary cannot spell are refused (naming the characters) or, with
    # drop_unknown=true, used without those characters.
    encoded = [encode_prompt(tokenizer, prompt, drop_unknown=cfg.drop_unknown) for prompt in raw_prompts]
    prompts = [tokenizer.decode(ids) for ids in encoded]
    decoding = Decoding(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, greedy=cfg.greedy)
    window = EvaluationSettings.of(cfg.evaluation, int(data_cfg.seq_len)).window if mode == "windowed" else None
    # A request too large for memory is refused before the first prompt's samples, not after them
    # (generation.generate checks each prompt again).
    check_generation_fits(model, max(map(len, encoded)), cfg.max_new_tokens, cfg.num_samples, mode, window)
    settings = dict(mode=mode, window=window, num_samples=cfg.num_samples, max_new_tokens=cfg.max_new_tokens,
                    **asdict(decoding), seed=cfg.seed, device=str(device))

    hp = task.hparams
    print(f"checkpoint: {display_path(checkpoint)} ({hp.model_name}: {model.family}, "
          f"{tokenizer.kind} tokenizer)")
    print("settings: " + ", ".join(f"{k}={v}" for k, v in settings.items() if v is not None))
    results, lines = [], []
    for prompt in prompts:
        started = time.perf_counter()
        [texts] = sample_texts(model, tokenizer, [prompt], mode=mode, max_new_tokens=cfg.max_new_tokens,
                               num_samples=cfg.num_samples, decoding=decoding, seed=cfg.seed, window=window,
                               progress=Progress(prefix=f"sampling {shown_prompt(prompt)}"))
        seconds = time.perf_counter() - started
        results.append({"prompt": prompt, "samples": texts, "seconds": seconds,
                        "tokens_per_second": cfg.num_samples * cfg.max_new_tokens / max(seconds, 1e-9)})
        for i, text in enumerate(texts, 1):
            lines += [f"=== {prompt!r} [{mode}, sample {i}/{len(texts)}]", text, ""]
    text_out = "\n".join(lines)
    print(text_out)

    atomic_write(output_dir / "samples.txt", text_out)  # the folder made with it
    record = {"checkpoint": str(Path(checkpoint).resolve()), "model": hp.model_name,
              "run_dir": str(run.path.resolve()) if run else None, "settings": settings,
              "seed": cfg.seed, "prompts": prompts, "results": results}
    write_json(output_dir / "sampling.json", record)
    print(f"saved: {display_path(output_dir / 'samples.txt')}, {display_path(output_dir / 'sampling.json')}")

    return record | scored(cfg, task, run, data_cfg, checkpoint, splits)


def scored(cfg: DictConfig, task, run: RunDir | None, data_cfg, checkpoint: Path, splits: Splits | None) -> dict:
    """evaluate=true's figures ("evaluation": evaluation.json) and stats=true's ("text": stats.json), those asked."""
    record = {}
    if cfg.evaluate:
        record["evaluation"] = score_checkpoint(cfg, task.model, task.tokenizer, run, data_cfg, checkpoint, splits)
    if cfg.get("stats"):
        record["text"] = measure_checkpoint_text(cfg, task.model, task.tokenizer, splits, int(data_cfg.seq_len),
                                                 checkpoint)
    return record


def splits_needed(cfg: DictConfig, data_cfg, tokenizer, device, always: bool = False) -> Splits | None:
    """The corpus evaluate=true or stats=true needs (`always`: explore=true's too), read (and the settings that do
    not fit it refused) before any sampling."""
    if not (always or cfg.evaluate or cfg.get("stats")):
        return None
    splits = read_splits(data_cfg, tokenizer, device)
    if cfg.evaluate:
        EvaluationSettings.of(cfg.evaluation, int(data_cfg.seq_len)).check_streams(splits.val_ids.numel() - 1)
    if cfg.get("stats"):
        check_stats_fit(cfg, splits)
    return splits


class Splits(NamedTuple):
    """The corpus the model trained on, split as it was: texts and token ids."""
    source: Path
    train_text: str
    val_text: str
    train_ids: torch.Tensor
    val_ids: torch.Tensor


def read_splits(data_cfg, tokenizer, device) -> Splits:
    source = corpus_path(data_cfg.path, data_cfg.url, data_cfg.get("sha256"), data_cfg.cache_dir)
    train_text, val_text = split_text(read_corpus(source), data_cfg.train_fraction)
    try:
        train_ids, val_ids = (torch.tensor(tokenizer.encode(t), dtype=torch.long, device=device)
                              for t in (train_text, val_text))
    except ValueError as error:
        raise UserError(f"{source} does not fit the model's vocabulary: {error}") from None
    return Splits(source, train_text, val_text, train_ids, val_ids)


def score_checkpoint(cfg: DictConfig, model, tokenizer, run: RunDir | None, data_cfg, checkpoint: Path,
                     splits: Splits) -> dict:
    """Every inference mode and the context curve on the validation split, by the run's own plan (its recorded
    training tokens; without its run folder every figure exact), the text statistics left to stats=true."""
    source, _, _, train_ids, val_ids = splits
    summary = (run.summary() if run else None) or {}
    started = time.perf_counter()
    request = run_request(cfg, model, Split.of(val_ids, tokenizer), summary.get("train_tokens"),
                          EvaluationSettings.of(cfg.evaluation, int(data_cfg.seq_len)), tokenizer=tokenizer,
                          train_ids=train_ids)
    evaluation = evaluate(request, progress=Progress(), skip=(TEXT,))
    modes, *others = evaluation.descriptions()  # the modes', then every other entry's (the cache's)
    print(f"{display_path(source)}: {modes}" + "".join(f"\n{other}" for other in others))
    figures = evaluation.summary()
    result = {"checkpoint": str(Path(checkpoint).resolve()), "data": str(source),
              "settings": figures.pop("mode_evaluation"), **evaluation.modes.metrics(), **figures,
              "seconds": time.perf_counter() - started}
    path = write_json(Path(cfg.paths.output_dir) / "evaluation.json", result)
    print(f"saved: {display_path(path)}")
    return result


# --- stats=true: the text statistics --------------------------------------------------------------------
def validate_stats(cfg: DictConfig) -> None:
    check_rules(cfg, [Rule("stats", lambda v: isinstance(v, bool), "true or false", may_be_absent=True)])
    text = stats_settings(cfg, 1)  # checked even without stats=true: a bad value is refused at once
    if cfg.get("stats") and not text.samples:
        raise UserError("stats=true measures evaluation.text.samples samples per setting, which is 0: "
                        "give an integer >= 1")


def stats_settings(cfg: DictConfig, seq_len: int) -> TextSettings:
    return replace(EvaluationSettings.of(cfg.evaluation, seq_len).text, seed=cfg.seed)


def check_stats_fit(cfg: DictConfig, splits: Splits) -> None:
    settings, n = stats_settings(cfg, 1), len(splits.val_text)
    where = f"the validation split of {display_path(splits.source)} has {n:,} characters"
    if settings.chars > n:
        raise UserError(f"invalid evaluation.text.chars={settings.chars}: the reference is slices of the validation "
                        f"split as long as the samples, and {where}")
    if settings.drift_chars and settings.stretch_chars > n:
        raise UserError(f"the drift's reference is slices of {settings.stretch_chars} characters, and {where}; "
                        "turn the drift off with evaluation.text.drift_chars=0")


def measure_checkpoint_text(cfg: DictConfig, model, tokenizer, splits: Splits, seq_len: int, checkpoint: Path) -> dict:
    """The text statistics of the samples in every mode × decoder, printed and written to stats.json."""
    started = time.perf_counter()
    index = TrainingIndex.cached(splits.train_text, Path(cfg.paths.data_dir))
    record = measure_text(model, tokenizer, index, splits.val_text, stats_settings(cfg, seq_len),
                          val_ids=splits.val_ids, progress=Progress(prefix="text statistics"))
    record = {"checkpoint": str(Path(checkpoint).resolve()), "data": str(splits.source), **record,
              "seconds": time.perf_counter() - started}
    print(format_text_statistics(record))
    path = write_json(Path(cfg.paths.output_dir) / "stats.json", record)
    print(f"saved: {display_path(path)} ({record['seconds']:.1f} s)")
    return record


# --- explore=true: the run's page -----------------------------------------------------------------------
EXPLORE_RULES = [
    Rule("explore_chars", int_at_least(2), "an integer >= 2 (characters of the validation split shown)"),
    Rule("explore_start", int_at_least(0), "an integer >= 0 (where the slice starts)"),
    Rule("explore_hold", int_at_least(2), "an integer >= 2 (a probe run: tokens a key is held unasked)"),
]


def explore_run(cfg: DictConfig, checkpoint: Path) -> dict:
    """The run's page; with evaluate=true and stats=true, their figures too (as sample.py's own, without samples)."""
    check_rules(cfg, EXPLORE_RULES)  # explore's keys, before the checkpoint is read
    validate_stats(cfg)
    if cfg.get("explore_text") is not None and cfg.get("explore_file"):
        raise UserError("give explore_text=... or explore_file=..., not both")
    task, device, run, data_cfg = load_run(cfg, checkpoint, reads_corpus=True)
    splits = splits_needed(cfg, data_cfg, task.tokenizer, device, always=True)
    page = write_explore_page(cfg, task.model, task.tokenizer, run, data_cfg, splits, checkpoint)
    return {"explore": page, **scored(cfg, task, run, data_cfg, checkpoint, splits)}


def explore_text(cfg: DictConfig, val_text: str) -> str:
    if cfg.get("explore_text") is not None:
        return unescape(str(cfg.explore_text))
    if cfg.get("explore_file"):
        return read_text_file(cfg.explore_file, "explore_file")
    if cfg.explore_start >= len(val_text) - 1:
        raise UserError(f"invalid explore_start={cfg.explore_start}: the validation split has {len(val_text):,} "
                        "characters")
    return val_text[cfg.explore_start:cfg.explore_start + cfg.explore_chars]


def planted_text(run: RunDir | None, corpus_text: str, ids: torch.Tensor, hold_ids: torch.Tensor, tokenizer,
                 seed: int) -> PlantedText | None:
    """The probe's pairs planted in ids when the run trained with it, and ⟪ k before hold_ids (never asked for)."""
    config = run.config() if run is not None else None
    probe_cfg = config.get("probe") if config is not None else None
    settings = ProbeSettings.from_config(OmegaConf.to_container(probe_cfg, resolve=True)) if probe_cfg else None
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


def write_explore_page(cfg: DictConfig, model, tokenizer, run: RunDir | None, data_cfg, splits, checkpoint) -> Path:
    started = time.perf_counter()
    text = explore_text(cfg, splits.val_text)
    ids = torch.tensor(encode_prompt(tokenizer, text, drop_unknown=cfg.drop_unknown), dtype=torch.long)
    if ids.numel() < 2:
        raise UserError("the text to explore needs at least two tokens")
    hold_ids = splits.val_ids[cfg.explore_start:cfg.explore_start + cfg.explore_hold].cpu()
    probe = planted_text(run, splits.train_text + splits.val_text, ids, hold_ids, tokenizer, cfg.seed)
    ids = probe.planting.ids if probe else ids
    seq_len = int(data_cfg.seq_len)
    data = explore(model, tokenizer, ids.to(model.device), seq_len=seq_len,
                   window=EvaluationSettings.of(cfg.evaluation, seq_len).window, probe=probe)
    data["title"] = {"model": (run.model_name() if run is not None else None) or Path(checkpoint).stem,
                     "checkpoint": display_path(checkpoint),
                     "text": "explore_text" if cfg.get("explore_text") is not None else
                     (cfg.explore_file or f"validation split, characters {cfg.explore_start:,} to "
                      f"{cfg.explore_start + len(text):,}"), "planted": probe is not None}
    path = run.explore_file if run is not None else Path(cfg.paths.output_dir) / EXPLORE
    atomic_write(path, render_page(data))
    print(f"saved: {display_path(path)} ({path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - started:.1f} s): "
          + ", ".join(f"{mode} {bpc:.4f}" for mode, bpc in data["bpc"].items()) + " bits per character")
    return path


def shown_prompt(prompt: str, limit: int = 40) -> str:
    """A prompt as a progress bar's label shows it: repr'd, cut to `limit` characters with its length said."""
    return repr(prompt) if len(prompt) <= limit else f"{prompt[:limit]!r}... ({len(prompt):,} characters)"
