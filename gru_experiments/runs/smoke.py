"""trainer.fast_dev_run=true is a smoke run: the whole pipeline (a training step, validation, every
inference mode, the context curve, the samples, summary.json) on a small slice, in seconds to a
minute for every model on a 2-core CPU (benchmarks/RESULTS.md), as Lightning's own fast_dev_run
answers "does this config compose and run?". Its figures are marked (summary.json "smoke": true)
and say nothing about the model.

The slice: Lightning's one training and one validation batch, and the first SMOKE_VAL_TOKENS tokens
of the validation split. The evaluation needs no setting of its own: its budget (evaluation.budget)
is a multiple of the one step trained.
"""

from __future__ import annotations

from omegaconf import OmegaConf
from torch import Tensor

SMOKE_VAL_TOKENS = 1024


def is_smoke(cfg) -> bool:
    """trainer.fast_dev_run set (true, or a number of batches)."""
    return bool(OmegaConf.select(cfg, "trainer.fast_dev_run", default=False))


def smoke_split(ids: Tensor, cfg) -> Tensor:
    """The validation split of a smoke run: its first SMOKE_VAL_TOKENS tokens (all of it otherwise)."""
    return ids[:SMOKE_VAL_TOKENS] if is_smoke(cfg) else ids
