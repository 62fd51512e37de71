"""sample.py's config checked before any checkpoint is read, as runs/checks.py checks train.py's, into the command's
`SampleSpec`: runs/sampling.py reads it, never the config (tests/test_spec.py)."""

from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from gru_experiments.errors import UserError
from gru_experiments.study.evaluation import DEFAULT_EVALUATION, EvaluationSettings
from gru_experiments.study.generation import Decoding, validate_sampling
from gru_experiments.validation import Rule, check_rules, int_at_least

# sample.py's own keys, checked before the checkpoint is read (the sampling settings: generation.validate_sampling)
SAMPLE_RULES = [
    *(Rule(key, lambda v: isinstance(v, bool), "true or false", may_be_absent=True)
      for key in ("evaluate", "stats", "explore")),
    Rule("cpu_threads", int_at_least(1), "null (torch's default) or an integer >= 1", optional=True),
]
EXPLORE_RULES = [
    Rule("explore_chars", int_at_least(2), "an integer >= 2 (characters of the validation split shown)"),
    Rule("explore_start", int_at_least(0), "an integer >= 0 (where the slice starts)"),
    Rule("explore_hold", int_at_least(2), "an integer >= 2 (a probe run: tokens a key is held unasked)"),
]


@dataclass(frozen=True)
class SampleSpec:
    """sample.py's checked config, in plain values (`validate_sample`): runs/sampling.py reads it, never the config.
    The data and evaluation groups are the command's, read only where the run recorded none."""
    # which checkpoint: run= (a run folder), ckpt= (a file); the device and torch's CPU threads (None: its default)
    run: Path | None
    ckpt: Path | None
    device: str
    cpu_threads: int | None
    # what to sample: the mode, the prompt(s) as given (prompt_file: a file of them), the decoding, how much
    mode: str
    prompt: str | list | None
    prompt_file: str | None
    drop_unknown: bool
    decoding: Decoding
    num_samples: int
    max_new_tokens: int
    seed: int
    # what else: evaluate=true, stats=true; explore=true's page (its text: explore_text, explore_file or a slice)
    evaluate: bool
    stats: bool
    explore: bool
    explore_text: str | None
    explore_file: str | None
    explore_start: int
    explore_chars: int
    explore_hold: int
    # the command's data and evaluation groups (plain), whether its command line names a data key, its changes
    data: dict
    data_named: bool
    evaluation: dict
    evaluation_changes: dict
    output_dir: Path
    data_dir: Path


def validate_sample(cfg) -> SampleSpec:
    """sample.py's keys, the sampling settings and the evaluation group, refused in one line before any checkpoint
    is read; the command line's data and evaluation keys noted."""
    from hydra.core.hydra_config import HydraConfig

    check_rules(cfg, SAMPLE_RULES)
    explore = bool(cfg.get("explore"))
    if explore:
        check_rules(cfg, EXPLORE_RULES)
        if cfg.get("explore_text") is not None and cfg.get("explore_file"):
            raise UserError("give explore_text=... or explore_file=..., not both")
    else:
        validate_sampling(cfg, vocab_size=None)
    evaluation = EvaluationSettings.of(cfg.evaluation, 1)  # checked even without evaluate= or stats=: at once
    if cfg.get("stats") and not evaluation.text.samples:
        raise UserError("stats=true measures evaluation.text.samples samples per setting, which is 0: "
                        "give an integer >= 1")
    if HydraConfig.initialized():  # the command line: what it names, the rest the run's own
        given = [str(o).lstrip("+~").partition("=")[0] for o in HydraConfig.get().overrides.task]
        data_named = any(key.startswith("data.") for key in given)
        if "model" in given and (cfg.get("run") or cfg.get("ckpt")):  # it picks a model's newest run, nothing else
            which = "run=" if cfg.get("run") else "ckpt="
            print(f"model={cfg.model.name} is ignored: {which} names the checkpoint, whose own model is sampled "
                  "(model= picks the newest run of that model where neither run= nor ckpt= is given)")
        changes = {key.removeprefix("evaluation."): OmegaConf.select(cfg, key) for key in given
                   if key.startswith("evaluation.")}
    else:  # composed in Python (a test): every data key as given, every evaluation key that differs from the default
        default = OmegaConf.load(DEFAULT_EVALUATION)
        data_named = True
        changes = _changed(OmegaConf.to_container(cfg.evaluation, resolve=True), OmegaConf.to_container(default))

    def path(key):
        return Path(str(cfg[key])).expanduser() if cfg.get(key) else None

    return SampleSpec(
        run=path("run"), ckpt=path("ckpt"), device=str(cfg.device), cpu_threads=cfg.get("cpu_threads"),
        mode=cfg.inference.mode, prompt=OmegaConf.to_container(cfg.prompt) if OmegaConf.is_config(cfg.get("prompt"))
        else cfg.get("prompt"), prompt_file=cfg.get("prompt_file"), drop_unknown=bool(cfg.drop_unknown),
        decoding=Decoding(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, greedy=cfg.greedy),
        num_samples=cfg.num_samples, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
        evaluate=bool(cfg.get("evaluate")), stats=bool(cfg.get("stats")), explore=explore,
        explore_text=None if cfg.get("explore_text") is None else str(cfg.explore_text),
        explore_file=cfg.get("explore_file"), explore_start=cfg.get("explore_start", 0),
        explore_chars=cfg.get("explore_chars", 0), explore_hold=cfg.get("explore_hold", 0),
        data=OmegaConf.to_container(cfg.data, resolve=True), data_named=data_named,
        evaluation=OmegaConf.to_container(cfg.evaluation, resolve=True), evaluation_changes=changes,
        output_dir=Path(cfg.paths.output_dir), data_dir=Path(cfg.paths.data_dir))


def _changed(group: dict, default: dict, prefix: str = "") -> dict:
    """The dotted keys of `group` whose values differ from `default`'s."""
    changed = {}
    for key, value in group.items():
        if isinstance(value, dict) and isinstance(default.get(key), dict):
            changed |= _changed(value, default[key], f"{prefix}{key}.")
        elif default.get(key, object()) != value:
            changed[f"{prefix}{key}"] = value
    return changed
