"""python sample.py run=RUN explore=true: the run's page, explore.html (study/explore.py, docs/explore.md), of
explore_text=, explore_file= or a slice of the validation split; a probe run's with the probe's pairs planted.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

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
from gru_experiments.files import atomic_write
from gru_experiments.runs.run_dir import EXPLORE, RunDir, display_path
from gru_experiments.runs.sampling import load_run, read_splits, unescape
from gru_experiments.study.evaluation import EvaluationSettings
from gru_experiments.study.explore import PlantedText, explore
from gru_experiments.study.explore_page import render_page
from gru_experiments.validation import Rule, check_rules, int_at_least

EXPLORE_RULES = [
    Rule("explore_chars", int_at_least(2), "an integer >= 2 (characters of the validation split shown)"),
    Rule("explore_start", int_at_least(0), "an integer >= 0 (where the slice starts)"),
    Rule("explore_hold", int_at_least(2), "an integer >= 2 (a probe run: tokens a key is held unasked)"),
]


def explore_run(cfg: DictConfig, checkpoint: Path) -> Path:
    check_rules(cfg, EXPLORE_RULES)  # explore's keys, before the checkpoint is read
    if cfg.get("explore_text") is not None and cfg.get("explore_file"):
        raise UserError("give explore_text=... or explore_file=..., not both")
    task, device, run, data_cfg = load_run(cfg, checkpoint, reads_corpus=True)
    splits = read_splits(data_cfg, task.tokenizer, device)
    return write_explore_page(cfg, task.model, task.tokenizer, run, data_cfg, splits, checkpoint)


def explore_text(cfg: DictConfig, val_text: str) -> str:
    if cfg.get("explore_text") is not None:
        return unescape(str(cfg.explore_text))
    if cfg.get("explore_file"):
        path = Path(cfg.explore_file).expanduser()
        if not path.is_file():
            raise UserError(f"explore_file not found: {cfg.explore_file}")
        return path.read_text(encoding="utf-8")
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
