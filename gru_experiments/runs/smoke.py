"""trainer.fast_dev_run=true is a smoke run: the whole pipeline (a training step, validation, every
inference mode, the context curve, the samples, summary.json) on a small slice, in seconds to a
minute for every model on a 2-core CPU (benchmarks/RESULTS.md), as Lightning's own fast_dev_run
answers "does this config compose and run?". Its figures are marked (summary.json "smoke": true)
and say nothing about the model.

The slice: Lightning's one training and one validation batch, at small batches of the model's own
window; the first SMOKE_VAL_TOKENS tokens of the validation split; an evaluation budget of
SMOKE["evaluation.max_tokens"] targets; short samples. The model, tokenizer and corpus are the run's own.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from torch import Tensor

SMOKE_VAL_TOKENS = 1024
SMOKE = {
    "data.batch_size": 4,
    "data.eval_batch_size": 8,  # x seq_len 128: the sliced split in one validation batch
    "evaluation.streams": 4,
    "evaluation.max_tokens": 16,  # 16 windows: the windowed pass of the biggest models stays seconds
    "evaluation.windowed_stride": 64,  # 16 of the slice's 1,023 targets (auto would take every 256th: 4)
    "evaluation.sample_chars": 20,
}


def is_smoke(cfg) -> bool:
    """trainer.fast_dev_run set (true, or a number of batches)."""
    return bool(OmegaConf.select(cfg, "trainer.fast_dev_run", default=False))


def smoke_config(cfg: DictConfig) -> DictConfig:
    """A copy of a smoke run's config with SMOKE's settings (each a ceiling: a smaller number given
    on the command line stays); any other run's config as it is."""
    if not is_smoke(cfg):
        return cfg
    cfg = cfg.copy()
    for key, ceiling in SMOKE.items():
        value = OmegaConf.select(cfg, key)
        smaller = isinstance(value, int) and value < ceiling
        OmegaConf.update(cfg, key, value if smaller else ceiling, force_add=True)
    return cfg


def smoke_split(ids: Tensor, cfg) -> Tensor:
    """The validation split of a smoke run: its first SMOKE_VAL_TOKENS tokens (all of it otherwise)."""
    return ids[:SMOKE_VAL_TOKENS] if is_smoke(cfg) else ids

