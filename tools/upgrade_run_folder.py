"""Upgrade a run folder of an older layout to today's, in place, once: the package reads today's layout only and
refuses an older run folder, sweep or checkpoint in one line naming this script (docs/configuration.md, *Old names*).

    python tools/upgrade_run_folder.py RUN_OR_SWEEP_FOLDER_OR_CHECKPOINT [...]

Below each path given it rewrites, in today's names: every run config Hydra recorded (.hydra/config.yaml, a resume's
.hydra/resumed_*/config.yaml, a sweep's multirun.yaml), the overrides and group choices recorded beside them
(overrides.yaml, hydra.yaml), summary.json, and every checkpoint's hyper-parameters and recorded config. One line
per change; a file with nothing to change is left untouched, so a second call changes nothing and says so. The
folders keep their names (runs/astra_alpha_seed/... stays): a run is known by what its files record.

The renamings are here alone (the package only detects an older layout: runs/run_dir.older_layout):
- issue 35: optim=seed is optim=original, model=*_seed is *_original, the flat evaluation keys are nested;
- before conf/optim: a top-level weight_decay is the original recipe at that decay;
- before the probe's phases: probe.distances, gap, min_targets are one phase validated at those distances;
- before evaluation.budget and model.epochs: the evaluation's token counts and the trainer's epochs are gone;
- before the models/ subpackage: the model classes' old paths (a checkpoint naming none: the recurrent model);
- before training=streams: every run trained on windows (its summary's training_mode, its config's training);
- older summaries: "cell" is "family", the training window and "recurrent" written out.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from anywhere: the package sits beside this folder

from gru_experiments.errors import UserError  # noqa: E402
from gru_experiments.files import read_json, write_json  # noqa: E402
from gru_experiments.runs.checkpoints import atomic_torch_save  # noqa: E402
from gru_experiments.runs.checks import model_recurrent  # noqa: E402
from gru_experiments.runs.run_contents import check_record  # noqa: E402

# The original study's recipe and the variants trained under it ("seed" also named the random seed).
RECIPES = {"seed": "original"}
# Model variants named for the recipe (*_seed), now for the original study (*_original).
MODELS = {"astra_alpha_seed": "astra_alpha_original", "transformer_seed": "transformer_original",
          "transformer_beta_seed": "transformer_beta_original"}
# Flat evaluation keys, now nested (conf/evaluation/default.yaml).
EVALUATION_KEYS = {"text_samples": "text.samples", "text_chars": "text.chars",
                   "text_drift_chars": "text.drift_chars", "sample_chars": "samples.chars",
                   "sample_temperature": "samples.temperature"}
# The models' module paths before the models/ subpackage, and the class of a checkpoint that names none.
MOVED_CLASSES = {
    "gru_experiments.model.RecurrentLM": "gru_experiments.models.recurrent.RecurrentLM",
    "gru_experiments.mlp.BengioMLP": "gru_experiments.models.mlp.BengioMLP",
    "gru_experiments.ngram.NGramLM": "gru_experiments.models.ngram.NGramLM",
    "gru_experiments.transformer.TransformerLM": "gru_experiments.models.transformer.TransformerLM",
}
UNNAMED_CLASS = "gru_experiments.models.recurrent.RecurrentLM"
# Keys gone since (the evaluation's cost is the one key evaluation.budget; a run's epochs and steps are its model's,
# model.epochs and model.steps_per_epoch): dropped.
REMOVED_KEYS = ("trainer.max_epochs", "data.steps_per_epoch", "evaluation.windowed_stride", "evaluation.max_tokens",
                "evaluation.curve_point_tokens", "evaluation.long_point_tokens", "evaluation.validation_tokens",
                "evaluation.batch_tokens", "model.eval_max_tokens", "model.eval_long_point_tokens")
PROBE_KEYS = ("distances", "gap", "min_targets")  # a probe from before the phases: one phase, same validation
GROUP_NAMES = {"optim": RECIPES, "model": MODELS}  # the config groups whose options were renamed


# --- a run's config, a checkpoint's hyper-parameters ----------------------------------------------
def upgrade_record(record: dict) -> list[str]:
    """A run's config or a checkpoint's hyper-parameters (a plain dict, interpolations as written) in today's names,
    changed in place: one line per change."""
    said = []
    model = record.get("model") if isinstance(record.get("model"), dict) else {}
    for key, architecture in (("architecture", record.get("architecture")),  # a checkpoint's, a config's
                              ("model.architecture", model.get("architecture"))):
        if isinstance(architecture, dict):
            target = architecture.get("_target_")
            new = MOVED_CLASSES.get(target, target) if target else UNNAMED_CLASS
            if new != target:
                architecture["_target_"] = new
                said.append(f"{key}._target_ {target} is now {new}")
    for node, key, group in ((record.get("optim"), "name", "optim"), (model, "name", "model"),
                             (record, "model_name", "model")):
        old = node.get(key) if isinstance(node, dict) else None
        if old in GROUP_NAMES[group]:
            node[key] = GROUP_NAMES[group][old]
            said.append(f"{group}={old} is now {group}={node[key]}")
    said += _nest_evaluation(record.get("evaluation"))
    if record.get("optim") is None and record.get("weight_decay") is not None:  # the recipe before conf/optim
        record["optim"] = {"name": "original", "weight_decay": record.pop("weight_decay")}
        said.append("weight_decay is now optim.weight_decay, under optim=original")
    probe = record.get("probe")
    if isinstance(probe, dict) and all(key in probe for key in PROBE_KEYS):
        old = {key: probe.pop(key) for key in PROBE_KEYS}
        probe["phases"] = [{"start": 0.0, "distances": old["distances"], "gap": old["gap"]}]
        probe["validation"] = old
        said.append("probe.distances, gap, min_targets are now one phase of probe.phases and probe.validation")
    for dotted in REMOVED_KEYS:
        group, _, leaf = dotted.partition(".")
        if isinstance(record.get(group), dict) and leaf in record[group]:
            del record[group][leaf]
            said.append(f"{dotted}: gone since, left out")
    if model and not isinstance(record.get("training"), dict):  # a run's config from before conf/training
        record["training"] = {"batching": "windows"}
        said.append("training.batching=windows added (before training=streams, every run trained on windows)")
    return said


def _nest_evaluation(evaluation) -> list[str]:
    moved = [flat for flat in EVALUATION_KEYS if isinstance(evaluation, dict) and flat in evaluation]
    for flat in moved:
        group, key = EVALUATION_KEYS[flat].split(".")
        if not isinstance(evaluation.get(group), dict):
            evaluation[group] = {}
        evaluation[group][key] = evaluation.pop(flat)
    return [f"evaluation.{flat} is now evaluation.{EVALUATION_KEYS[flat]}" for flat in moved]


def upgrade_overrides(overrides: list) -> list[str]:
    """A recorded command line (`key=value` strings) in today's names, changed in place."""
    said = []
    for index, override in reversed(list(enumerate(overrides))):
        key, sign, value = str(override).partition("=")
        bare = key.lstrip("+~")
        new = override
        if bare in GROUP_NAMES:  # a sweep's lists too: model=astra_alpha,astra_alpha_seed
            new = f"{key}{sign}{','.join(GROUP_NAMES[bare].get(name, name) for name in value.split(','))}"
        elif bare.startswith("evaluation.") and (flat := bare.removeprefix("evaluation.")) in EVALUATION_KEYS:
            new = f"{key.replace(flat, EVALUATION_KEYS[flat])}{sign}{value}"
        elif bare in REMOVED_KEYS:
            new = None
        if new is None:
            del overrides[index]
            said.append(f"override {override}: gone since, left out")
        elif new != override:
            overrides[index] = new
            said.append(f"override {override} is now {new}")
    return said[::-1]


def upgrade_hydra(hydra: dict) -> list[str]:
    """Hydra's own record (hydra.yaml's or multirun.yaml's hydra:): its command line and its group choices."""
    said = upgrade_overrides((hydra.get("overrides") or {}).get("task") or [])
    choices = (hydra.get("runtime") or {}).get("choices") or {}
    for group, names in GROUP_NAMES.items():
        if choices.get(group) in names:
            said.append(f"choice {group}={choices[group]} is now {group}={names[choices[group]]}")
            choices[group] = names[choices[group]]
    return said


# --- the files -------------------------------------------------------------------------------------
def upgrade_yaml(path: Path) -> list[str]:
    """A file of Hydra's record: a config (config.yaml, multirun.yaml), hydra.yaml or overrides.yaml."""
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    if isinstance(data, list):
        said = upgrade_overrides(data)
    else:
        hydra = data.pop("hydra", None)
        said = (upgrade_record(data) if data else []) + (upgrade_hydra(hydra) if isinstance(hydra, dict) else [])
        if hydra is not None:
            data = {"hydra": hydra, **data}
    if said:
        _writing(path, lambda: OmegaConf.save(OmegaConf.create(data), path))
    return said


def upgrade_summary(path: Path) -> list[str]:
    """summary.json: the renamed names, "cell" as "family", and a finished run's training mode, window and whether
    its model is recurrent written out (today's says each; the run's config says what an older one left out)."""
    summary = read_json(path)
    if not isinstance(summary, dict):
        return []
    config_file = max(path.parent.glob(".hydra/resumed_*/config.yaml"), default=path.parent / ".hydra/config.yaml")
    config = OmegaConf.to_container(OmegaConf.load(config_file)) if config_file.is_file() else {}
    said = []
    for group, names in GROUP_NAMES.items():
        if summary.get(group) in names:
            said.append(f"summary {group} {summary[group]} is now {names[summary[group]]}")
            summary[group] = names[summary[group]]
    if "cell" in summary:
        summary.setdefault("family", summary.pop("cell"))
        said.append("summary cell is now family")
    if summary.get("status") == "failed":  # a failure record says none of these: the report reads the config's
        return _write(path, summary, said)
    if not summary.get("training_mode"):
        summary["training_mode"] = "windows"
        said.append("summary training_mode windows added (before training=streams, every run trained on windows)")
    if not isinstance(summary.get("seq_len"), int):
        windows = [(source if isinstance(source, dict) else {}).get("seq_len") for source in (
            summary.get("mode_evaluation"), summary.get("recall"), config.get("data"))]
        window = next((int(w) for w in windows if isinstance(w, (int, float)) and not isinstance(w, bool)
                       and math.isfinite(w)), None)
        if window is not None:
            summary["seq_len"] = window
            said.append(f"summary seq_len {window} added (the training window)")
    if not isinstance(summary.get("recurrent"), bool):
        recurrent = (summary["context"] is None if "context" in summary else
                     model_recurrent((config.get("model") or {}).get("architecture")))
        if isinstance(recurrent, bool):
            summary["recurrent"] = recurrent
            said.append(f"summary recurrent {str(recurrent).lower()} added")
    return _write(path, summary, said)


def _write(path: Path, summary: dict, said: list[str]) -> list[str]:
    if said:
        _writing(path, lambda: write_json(path, summary))
    return said


def upgrade_checkpoint(path: Path) -> list[str]:
    """A checkpoint's hyper-parameters and recorded run config, read without running code, written atomically."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    said = []
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("hyper_parameters"), dict):
        said += upgrade_record(checkpoint["hyper_parameters"])
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("run_config"), dict):
        said += [f"recorded config: {line}" for line in upgrade_record(checkpoint["run_config"])]
    if said:
        _writing(path, lambda: atomic_torch_save(checkpoint, path))
    return said


class NotWritten(Exception):
    """A file this script read and would change but could not write (a folder without write permission, a full
    disk): said in a line, the script's exit status 1."""


def _writing(path: Path, write) -> None:
    try:
        write()
    except OSError as error:
        raise NotWritten(f"could not write it ({error.strerror or error}): left as it was") from None


def run_files(path: Path) -> list[Path]:
    """The files of every run below `path` that record a name (configs before summaries: a summary reads its
    config), or `path` itself where it is a checkpoint."""
    if path.is_file():
        return [path]
    hydra = [p for p in sorted(path.rglob("*.yaml")) if ".hydra" in (p.parent.name, p.parent.parent.name)]
    return [*hydra, *sorted(path.rglob("multirun.yaml")), *sorted(path.rglob("summary.json")),
            *sorted(p for p in path.rglob("*.ckpt") if p.parent.name == "checkpoints")]


def check_callables(path: Path) -> None:
    """UserError, before anything is written, where a record below `path` (in today's names, as it would be written)
    names a callable the project does not build from a run folder (runs/run_contents.py: a run folder is data)."""
    for file in run_files(path):
        try:
            if file.suffix == ".ckpt":
                checkpoint = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
                hyper, config = checkpoint.get("hyper_parameters"), checkpoint.get("run_config")
                records = [(f"{file} (its hyper-parameters)", {"model": {"architecture": hyper.get("architecture")}}),
                           (f"{file} (its recorded config)", config)] if isinstance(hyper, dict) else []
                for record in (hyper, config):
                    if isinstance(record, dict):
                        upgrade_record(record)
            elif file.suffix == ".yaml":
                data = OmegaConf.to_container(OmegaConf.load(file), resolve=False)
                hydra = data.get("hydra") if isinstance(data, dict) else None
                if isinstance(data, list):
                    upgrade_overrides(data)
                elif isinstance(data, dict):
                    upgrade_record(data)
                if isinstance(hydra, dict):
                    upgrade_hydra(hydra)
                records = [(file, data)]
            else:
                continue
        except UserError:
            raise
        except Exception:  # noqa: BLE001 - an unreadable file is said so by upgrade(), and left as it is
            continue
        for where, record in records:
            if isinstance(record, (dict, list)):
                check_record(record, where)


def upgrade(path: Path) -> int:
    """Every file below `path` in today's names, a line per change and one at the end. Returns the changes, or -1
    where a file could not be written."""
    changes, unwritten = 0, 0
    for file in run_files(path):
        upgrader = (upgrade_summary if file.suffix == ".json" else upgrade_checkpoint if file.suffix == ".ckpt"
                    else upgrade_yaml)
        try:
            said = upgrader(file)
        except NotWritten as error:
            print(f"{file}: {error}")
            unwritten += 1
            continue
        except Exception as error:  # noqa: BLE001 - one unreadable file leaves the others to upgrade
            print(f"{file}: unreadable ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}), "
                  "left as it is")
            continue
        for line in said:
            print(f"{file}: {line}")
            changes += 1
    if unwritten:
        print(f"{path}: {unwritten} file(s) could not be written, so it is not in today's layout yet ({changes} "
              "changes written); make it writable, then run this script again", file=sys.stderr)
        return -1
    print(f"{path}: upgraded to today's layout ({changes} changes)" if changes else
          f"{path}: already in today's layout, nothing changed")
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run folders, sweep folders or checkpoints")
    paths = parser.parse_args(argv).paths
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        print(f"error: no such run folder, sweep folder or checkpoint: {', '.join(missing)}; nothing was changed",
              file=sys.stderr)
        return 2
    try:
        for path in paths:
            check_is_run(path)
            check_callables(path)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 1 if min(upgrade(path) for path in paths) < 0 else 0


def check_is_run(path: Path) -> None:
    """UserError for what is no run folder, sweep folder or checkpoint: a file that is not a checkpoint (a text file),
    a folder with no run below it (it once said "already in today's layout" of anything)."""
    if path.is_file():
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - whatever it is, it is no checkpoint this script reads
            checkpoint = None
        if not (isinstance(checkpoint, dict) and "state_dict" in checkpoint):
            raise UserError(f"{path} is a file but not a checkpoint (one torch.load reads, weights only): give a run "
                            "folder, a sweep folder or a checkpoint; nothing was changed")
    elif not run_files(path):
        raise UserError(f"{path} holds no run: no .hydra/ record, summary.json, multirun.yaml or checkpoints/*.ckpt "
                        "below it; give a run folder, a sweep folder or a checkpoint; nothing was changed")


if __name__ == "__main__":
    sys.exit(main())
