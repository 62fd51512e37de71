"""The one way a config value is checked, before any work: a Rule names a key, a predicate and what it allows in
words; `check_rules` checks a mapping against its rules (and its known keys), always in one line naming the key:
`invalid KEY=VALUE: must be ALLOWED` or `unknown key KEY: OWNER takes A, B`. The rules live with what they
describe; a model's constructor checks its arguments with `check_setting`."""

import math
from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import OmegaConf

from gru_experiments.errors import UserError

MISSING = object()


@dataclass(frozen=True)
class Rule:
    key: str  # dotted path in the config
    check: Callable[[Any], bool]
    allowed: str  # what the value must be, in words
    optional: bool = False  # the key may be absent or null
    may_be_absent: bool = False  # the key may be absent (but not null: optional says that)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda v: is_int(v) and v >= low


def positive_number(v) -> bool:
    return is_number(v) and v > 0


def non_negative_number(v) -> bool:
    return is_number(v) and v >= 0


def open_fraction(v) -> bool:  # (0, 1)
    return is_number(v) and 0 < v < 1


def fraction(v) -> bool:  # [0, 1)
    return is_number(v) and 0 <= v < 1


def check_finite(config, prefix: str = "") -> None:
    """UserError, in one line naming the key, for a NaN or an infinity anywhere in a plain config (what a key that
    takes a number must never get: `model.architecture.forget_bias=nan` trained, then "diverged")."""
    items = config.items() if isinstance(config, dict) else enumerate(config) if isinstance(config, list) else ()
    for key, value in items:
        where = f"{prefix}{key}" if isinstance(config, dict) else f"{prefix[:-1]}[{key}]"
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidSetting(where, value, "a finite number (NaN and infinities are no setting)")
        check_finite(value, f"{where}.")


def temperature_rule(key: str = "temperature") -> Rule:
    """The one rule for a sampling temperature, wherever it is set."""
    return Rule(key, non_negative_number, "a number >= 0 (0: greedy, the argmax)", may_be_absent=True)


class InvalidSetting(UserError):
    """A value its rule refuses: `key` as the rule names it, `prefix` where it sits in the config."""

    def __init__(self, key: str, value, allowed: str, prefix: str = ""):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"invalid {prefix}{key}={'missing' if value is MISSING else repr(value)}: must be {allowed}")


def check_setting(ok: bool, key: str, value, allowed: str) -> None:
    if not ok:
        raise InvalidSetting(key, value, allowed)


def check_ints(**values) -> None:
    """Each setting an integer >= 1, in the order given."""
    for key, value in values.items():
        check_setting(int_at_least(1)(value), key, value, "an integer >= 1")


def check_dropout(value, key: str = "dropout") -> None:
    check_setting(fraction(value), key, value, "a number in [0, 1)")


def select(cfg, key: str):
    if OmegaConf.is_config(cfg):
        return OmegaConf.select(cfg, key, default=MISSING)
    value = cfg
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def check_rules(cfg, rules: list[Rule], prefix: str = "", known=None, owner: str = "") -> None:
    """Every rule against `cfg`; with `known`, any other key is refused too, naming `owner` (or the prefix)."""
    unknown = [key for key in cfg if key not in known] if known is not None else []
    if unknown:
        raise UserError(f"unknown key {prefix}{unknown[0]}: {owner or prefix.rstrip('.')} takes {', '.join(known)}")
    for rule in rules:
        value = select(cfg, rule.key)
        if value is MISSING and (rule.optional or rule.may_be_absent) or value is None and rule.optional:
            continue
        if value is MISSING or not rule.check(value):
            raise InvalidSetting(rule.key, value, rule.allowed, prefix)
