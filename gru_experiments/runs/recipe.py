"""The optimiser recipe (conf/optim/): AdamW's settings, which weights decay, and the learning-rate schedule
of the model's model.lr. The two shipped and why: docs/transformer.md, *The recipe*."""

import math
from dataclasses import asdict, dataclass, fields

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from gru_experiments.errors import UserError
from gru_experiments.validation import Rule, check_rules, fraction, int_at_least, non_negative_number

DECAYS = ("all", "matrices")
INTERVALS = ("epoch", "step")
TARGET = "gru_experiments.runs.recipe.Recipe"  # conf/optim's _target_
RULES = [
    Rule("betas", lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(map(fraction, v)),
         "two numbers in [0, 1)", may_be_absent=True),  # absent: the dataclass's default
    Rule("weight_decay", non_negative_number, "a number >= 0", may_be_absent=True),
    Rule("decay", lambda v: v in DECAYS, " or ".join(DECAYS), may_be_absent=True),
    Rule("warmup_steps", int_at_least(0), "an integer >= 0", may_be_absent=True),
    Rule("floor", fraction, "a number in [0, 1)", may_be_absent=True),
    Rule("interval", lambda v: v in INTERVALS, " or ".join(INTERVALS), may_be_absent=True),
]


@dataclass(frozen=True)
class Recipe:
    """A conf/optim group; its keys: docs/configuration.md, *optim*."""
    name: str
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    decay: str = "all"
    warmup_steps: int = 0
    floor: float = 0.0
    interval: str = "epoch"

    def __post_init__(self):
        check_rules(self.__dict__, RULES, "optim.")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))

    @classmethod
    def from_config(cls, optim) -> "Recipe":
        optim = OmegaConf.to_container(optim) if OmegaConf.is_config(optim) else dict(optim)
        rules = [Rule("_target_", lambda v: v == TARGET, TARGET, may_be_absent=True),
                 Rule("name", lambda v: isinstance(v, str), "a name"), *RULES]
        check_rules(optim, rules, "optim.", known=["_target_", *(f.name for f in fields(cls))])
        return instantiate({**optim, "_target_": TARGET}, _convert_="all")

    def to_dict(self) -> dict:
        return {**asdict(self), "betas": list(self.betas)}

    def parameter_groups(self, model: nn.Module) -> list[dict]:
        """AdamW's parameter groups, in the model's order: all, or the decayed matrices and the rest."""
        parameters = list(model.parameters())
        if self.decay == "all":
            return [{"params": parameters, "weight_decay": self.weight_decay}]
        matrices = {id(p) for m in model.modules() if not isinstance(m, nn.Embedding)
                    for p in m.parameters(recurse=False) if p.ndim >= 2}
        return [{"params": [p for p in parameters if id(p) in matrices], "weight_decay": self.weight_decay},
                {"params": [p for p in parameters if id(p) not in matrices], "weight_decay": 0.0}]

    def optimizer(self, model: nn.Module, lr: float) -> torch.optim.AdamW:
        return torch.optim.AdamW(self.parameter_groups(model), lr=lr, betas=self.betas)

    def schedule(self, optimizer, trainer) -> "WarmupCosine":
        """Over the trainer's optimiser steps; in epochs for an `epoch` recipe without warmup of whole epochs."""
        steps = trainer.estimated_stepping_batches
        per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
        if not math.isfinite(steps):
            raise UserError("the learning-rate schedule needs a training length: set model.epochs "
                            "or trainer.max_steps")
        if self.warmup_steps and self.warmup_steps >= steps:  # the learning rate never reaches model.lr
            print(f"optim.warmup_steps={self.warmup_steps} is not shorter than this run's {int(steps):,} steps: the "
                  f"learning rate never leaves its warmup (it ends at {steps / (self.warmup_steps + 1):.1%} of "
                  "model.lr); set fewer warmup steps, or train longer, for the recipe's schedule")
        if self.interval == "epoch" and not self.warmup_steps and per_epoch and steps % per_epoch == 0:
            return WarmupCosine(optimizer, steps // per_epoch, "epoch", self.warmup_steps, self.floor)
        return WarmupCosine(optimizer, steps, "step", self.warmup_steps, self.floor)


def recipe_length(cfg) -> tuple[int, int]:
    """A config's (model.epochs, model.steps_per_epoch), for the trainer and the batches; (1, 1) where unset."""
    return (OmegaConf.select(cfg, "model.epochs", default=None) or 1,
            OmegaConf.select(cfg, "model.steps_per_epoch", default=None) or 1)


class WarmupCosine(torch.optim.lr_scheduler.CosineAnnealingLR):
    """`warmup` intervals of nanoGPT's linear warmup, then a half cosine down to floor × model.lr. Without warmup
    torch's CosineAnnealingLR itself: a closed form differs in the last bit from every earlier run's rates."""

    def __init__(self, optimizer, length: int, interval: str, warmup: int = 0, floor: float = 0.0):
        self.interval, self.warmup = interval, int(warmup)
        peak = optimizer.param_groups[0]["lr"]
        super().__init__(optimizer, T_max=max(int(length) - self.warmup, 1), eta_min=floor * peak)

    def get_lr(self) -> list[float]:
        if self.warmup == 0:
            return super().get_lr()
        if self.last_epoch < self.warmup:
            return [base * (self.last_epoch + 1) / (self.warmup + 1) for base in self.base_lrs]
        t = min(self.last_epoch - self.warmup, self.T_max)
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * t / self.T_max)) / 2
                for base in self.base_lrs]
