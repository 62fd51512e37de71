"""trainer.fast_dev_run=true is a smoke run: the whole pipeline on a small slice (Lightning's one training and
one validation batch, the first SMOKE_VAL_TOKENS validation tokens), its figures marked "smoke" in summary.json.
"""

from __future__ import annotations

from omegaconf import OmegaConf
from torch import Tensor

SMOKE_VAL_TOKENS = 1024


def is_smoke(cfg) -> bool:
    return bool(OmegaConf.select(cfg, "trainer.fast_dev_run", default=False))


def smoke_split(ids: Tensor, cfg) -> Tensor:
    return ids[:SMOKE_VAL_TOKENS] if is_smoke(cfg) else ids
