"""The names that changed, in one place: what an old run folder, checkpoint or command line says,
and what it says now. Whatever reads an old config upgrades it here, once, and says so in
one printed line per name.

    upgrade_config(cfg)        a run's saved config (.hydra/config.yaml: run_dir.RunDir.config) or a
                               checkpoint's hyper-parameters (checkpoints.read_checkpoint), in place
    upgrade_overrides(args)    a command line, or a run's recorded one (resume.rewrite_argv)
"""

from __future__ import annotations

from contextlib import nullcontext

from omegaconf import DictConfig, OmegaConf, open_dict

from gru_experiments.errors import UserError

# The original study's recipe and the variants trained under it ("seed" also named the random seed).
RECIPES = {"seed": "original"}
# Model variants that are experiments now (conf/experiment/): model=astra_alpha_seed is experiment=astra_alpha_original.
MODELS = {"astra_alpha_seed": "astra_alpha_original", "transformer_seed": "transformer_original",
          "transformer_beta_seed": "transformer_beta_original"}
# Flat evaluation keys, now nested (conf/evaluation/default.yaml).
EVALUATION_KEYS = {"text_samples": "text.samples", "text_chars": "text.chars",
                   "text_drift_chars": "text.drift_chars", "sample_chars": "samples.chars",
                   "sample_temperature": "samples.temperature"}
# The models' old module paths, as older checkpoints name their class, and the class of those that name none.
MOVED_CLASSES = {
    "gru_experiments.model.RecurrentLM": "gru_experiments.models.recurrent.RecurrentLM",
    "gru_experiments.mlp.BengioMLP": "gru_experiments.models.mlp.BengioMLP",
    "gru_experiments.ngram.NGramLM": "gru_experiments.models.ngram.NGramLM",
    "gru_experiments.transformer.TransformerLM": "gru_experiments.models.transformer.TransformerLM",
}
UNNAMED_CLASS = "gru_experiments.models.recurrent.RecurrentLM"

_said: set[str] = set()  # each change is printed once per process, however often the same config is read


def _say(old: list[str], new: list[str]) -> None:
    verb = "is" if len(old) == 1 else "are"
    line = f"{', '.join(old)} {verb} now {', '.join(new)} (docs/configuration.md: old names)"
    if line not in _said:
        _said.add(line)
        print(line)


def upgrade_config(cfg):
    """A run's config or a checkpoint's hyper-parameters (a DictConfig or dict, or None) in today's names, changed
    in place and returned: optim.name seed, model.name (or model_name) *_seed, the flat evaluation keys. One printed
    line per changed name; a config already in today's names is returned as it is (idempotent). A model class
    path that moved is today's, without a line."""
    if cfg is None:
        return cfg
    with open_dict(cfg) if isinstance(cfg, DictConfig) else nullcontext():
        if isinstance(cfg.get("architecture"), dict):  # a checkpoint's hyper-parameters
            cfg["architecture"].setdefault("_target_", UNNAMED_CLASS)
        for architecture in (cfg.get("architecture"), OmegaConf.select(cfg, "model.architecture", default=None)
                             if isinstance(cfg, DictConfig) else None):
            target = architecture.get("_target_") if hasattr(architecture, "get") else None
            if target in MOVED_CLASSES:
                architecture["_target_"] = MOVED_CLASSES[target]
        for group, key, table in (("optim", "name", RECIPES), ("model", "name", MODELS), (None, "model_name", MODELS)):
            node = cfg.get(group) if group else cfg
            old = node.get(key) if hasattr(node, "get") else None
            if isinstance(old, str) and old in table:
                node[key] = table[old]
                _say(*_renamed("optim" if table is RECIPES else "model", old))
        evaluation = cfg.get("evaluation")
        moved = [flat for flat in EVALUATION_KEYS if hasattr(evaluation, "keys") and flat in evaluation]
        for flat in moved:
            group, key = EVALUATION_KEYS[flat].split(".")
            value = _raw(evaluation, flat)
            del evaluation[flat]
            if not hasattr(evaluation.get(group), "keys"):
                evaluation[group] = {}
            evaluation[group][key] = value
        if moved:
            _say([f"evaluation.{flat}" for flat in moved], [f"evaluation.{EVALUATION_KEYS[flat]}" for flat in moved])
    return cfg


def _renamed(key: str, old: str) -> tuple[list[str], list[str]]:
    """The line for a renamed recipe or model, the same wherever the old name was read."""
    return ([f"{key}={old}"], [f"optim={RECIPES[old]}" if key == "optim" else f"experiment={MODELS[old]}"])


def _raw(node, key: str):
    """node[key] as written: an interpolation stays one."""
    return OmegaConf.to_container(node, resolve=False)[key] if isinstance(node, DictConfig) else node[key]


def upgrade_overrides(overrides: list[str]) -> list[str]:
    """Command-line overrides in today's names: model=astra_alpha_seed is experiment=astra_alpha_original,
    optim=seed (and optim.name=seed) optim=original, evaluation.text_samples=N evaluation.text.samples=N, and
    +experiment=NAME experiment=NAME (conf/train.yaml has the group now). One printed line per changed name."""
    upgraded = []
    for override in overrides:
        key, equals, value = str(override).partition("=")
        prefix, name = key[:len(key) - len(key.lstrip("+~"))], key.lstrip("+~")
        if name == "model" and any(v in MODELS for v in value.split(",")):
            if not all(v in MODELS for v in value.split(",")):
                raise UserError(f"{override}: {', '.join(MODELS)} are experiments now (conf/experiment/); a sweep "
                                "of models and experiments together: python sweep.py models=[...]")
            new = f"experiment={','.join(MODELS[v] for v in value.split(','))}"
        elif name in ("optim", "optim.name") and value in RECIPES:
            new = f"{key}={RECIPES[value]}"
        elif name.startswith("evaluation.") and name.partition(".")[2] in EVALUATION_KEYS:
            new = f"{prefix}evaluation.{EVALUATION_KEYS[name.partition('.')[2]]}{equals}{value}"
        elif key == "+experiment":
            new = f"experiment={value}"
        else:
            upgraded.append(override)
            continue
        _say([str(override)], [new])
        upgraded.append(new)
    return upgraded
