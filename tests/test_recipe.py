"""The optimiser recipe (runs/recipe.py, conf/optim/): the warmup and cosine against nanoGPT's get_lr,
the original recipe's schedule torch's CosineAnnealingLR bit for bit, which weights decay, AdamW's settings, the
refused values, every model config's recipe, and a tiny run; and the learning-rate schedule spans the training
actually configured (a full recipe, a step count, a 300-step run ending at its floor, a resume)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import CONF, MODELS
from omegaconf import OmegaConf
from robustness_helpers import TINY, train

from gru_experiments.errors import UserError
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.models.transformer import TransformerLM
from gru_experiments.runs.checks import validate
from gru_experiments.runs.recipe import Recipe, WarmupCosine, recipe_length
from gru_experiments.runs.task import LanguageModelTask

V = 11
TRANSFORMER_RECIPE = ("transformer", "transformer_beta", "nanogpt_shakespeare")
TRAINED_MODELS = sorted(path.stem for path in (CONF / "model").glob("*.yaml") if not path.stem.startswith("ngram"))
# The variants (conf/model/) and experiments (conf/experiment/) trained under another recipe than their base model's.
VARIANTS = {"model=transformer_original": "original", "model=transformer_beta_original": "original",
            "model=astra_alpha_original": "original", "experiment=recall_transformer_windows": "transformer"}


def shipped(name: str) -> Recipe:
    """A recipe as conf/optim/<name>.yaml writes it."""
    return Recipe.from_config(OmegaConf.load(CONF / "optim" / f"{name}.yaml"))


def nanogpt_lr(it: int, lr: float, warmup: int, length: int, min_lr: float) -> float:
    """nanoGPT's get_lr (train.py), with lr_decay_iters = length."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > length:
        return min_lr
    ratio = (it - warmup) / (length - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def transformer(tie_head: bool) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(V, block_size=8, embedding_dim=8, num_layers=2, num_heads=2, dropout=0.0, bias=True,
                         tie_head=tie_head)


def names_by_id(model: torch.nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def assert_partition_in_order(model: torch.nn.Module, groups: list[dict]) -> None:
    """Every parameter in exactly one group, each group in model.parameters() order."""
    position = {id(p): i for i, p in enumerate(model.parameters())}
    grouped = [id(p) for group in groups for p in group["params"]]
    assert len(grouped) == len(set(grouped)) == len(position) and set(grouped) == set(position)
    for group in groups:
        indices = [position[id(p)] for p in group["params"]]
        assert indices == sorted(indices)


# --- the schedule ------------------------------------------------------------------------

def test_warmup_cosine_is_nanogpts_get_lr():
    """300 steps, 100 of warmup, floor 0.1: nanoGPT's learning rate at every step, from lr/101 up to lr
    at step 100 and down to floor x lr at the end."""
    lr, length, warmup, floor = 1e-3, 300, 100, 0.1
    opt = optimizer(lr)
    rates = learning_rates(opt, WarmupCosine(opt, length, "step", warmup, floor), length)
    reference = [nanogpt_lr(it, lr, warmup, length, floor * lr) for it in range(length + 1)]
    assert rates == pytest.approx(reference, rel=1e-12, abs=1e-18)
    assert rates[0] == pytest.approx(lr / 101, rel=1e-12)
    assert rates.index(max(rates)) == warmup and rates[warmup] == pytest.approx(lr, rel=1e-12)
    assert rates[-1] == pytest.approx(floor * lr, rel=1e-12)
    assert all(a < b for a, b in zip(rates[:warmup + 1], rates[1:warmup + 1]))  # warmup: rising
    assert all(a > b for a, b in zip(rates[warmup:], rates[warmup + 1:]))  # cosine: falling


def test_the_transformer_recipe_steps_per_step_even_over_whole_epochs():
    """conf/optim/transformer.yaml over 300 steps of 100-step epochs: a schedule in steps, nanoGPT's."""
    recipe, lr = shipped("transformer"), 3e-3
    opt = optimizer(lr)
    schedule = recipe.schedule(opt, fake_trainer(300, 100))
    assert schedule.interval == "step" and schedule.warmup == 100
    rates = learning_rates(opt, schedule, 300)
    assert rates == pytest.approx([nanogpt_lr(it, lr, 100, 300, 0.1 * lr) for it in range(301)], rel=1e-12)


def test_the_original_recipe_over_steps_is_torchs_cosine_bit_for_bit():
    """Recipe("original") over 250 steps of 100-step epochs (not whole epochs): per step, and exactly
    torch's CosineAnnealingLR(T_max=250), its recursive form's last bits included."""
    opt = optimizer(3e-3)
    schedule = Recipe("original").schedule(opt, fake_trainer(250, 100))
    assert schedule.interval == "step" and schedule.T_max == 250
    reference_opt = optimizer(3e-3)
    reference = torch.optim.lr_scheduler.CosineAnnealingLR(reference_opt, T_max=250)
    rates = learning_rates(opt, schedule, 250)
    assert rates == learning_rates(reference_opt, reference, 250)  # bit for bit
    assert rates[0] == 3e-3 and rates[-1] == 0.0


# --- which weights decay -----------------------------------------------------------------

@pytest.mark.parametrize("tie_head", [False, True])
def test_matrices_decay_the_transformers_linear_weights_only(tie_head):
    """decay=matrices on TransformerLM: qkv, proj, fc and head weights decay; the token and position
    embeddings, LayerNorm gains and biases do not. A tied head's weight appears once, decayed."""
    model = transformer(tie_head)
    groups = Recipe("t", weight_decay=0.1, decay="matrices").parameter_groups(model)
    assert [group["weight_decay"] for group in groups] == [0.1, 0.0]
    assert_partition_in_order(model, groups)
    name = names_by_id(model)
    decayed = {name[id(p)] for p in groups[0]["params"]}
    linear = {f"blocks.{i}.{m}.weight" for i in range(2)
              for m in ("attention.qkv", "attention.proj", "mlp.fc", "mlp.proj")}
    assert decayed == linear | {"wte.weight" if tie_head else "head.weight"}  # tied: named after the embedding
    kept = {name[id(p)] for p in groups[1]["params"]}
    assert kept == set(name.values()) - decayed
    assert {"wpe.weight", "ln_f.weight", "blocks.0.ln_1.weight", "blocks.1.attention.qkv.bias"} <= kept
    assert tie_head == ("wte.weight" not in kept)
    head_weight = [p for group in groups for p in group["params"] if p is model.head.weight]
    assert len(head_weight) == 1 and any(p is model.head.weight for p in groups[0]["params"])
    assert all(not n.endswith(".bias") for n in decayed)


@pytest.mark.parametrize("cell, layer_norm", [("gru", False), ("lstm", True), ("rnn", False)])
def test_matrices_decay_the_recurrent_cells_weights_not_the_embedding(cell, layer_norm):
    """decay=matrices on RecurrentLM: the 2-D cell weights and the head's decay; the embedding, the
    biases and a LayerNorm's gain do not."""
    torch.manual_seed(0)
    model = RecurrentLM(V, cell=cell, embedding_dim=4, hidden_size=6, num_layers=2, dropout=0.0,
                        layer_norm=layer_norm)
    groups = Recipe("original", decay="matrices").parameter_groups(model)
    assert [group["weight_decay"] for group in groups] == [0.01, 0.0]
    assert_partition_in_order(model, groups)
    name = names_by_id(model)
    decayed = {name[id(p)] for p in groups[0]["params"]}
    kept = {name[id(p)] for p in groups[1]["params"]}
    assert decayed and all(n.startswith(("layers.", "head.")) and "weight" in n for n in decayed)
    assert all(p.ndim == 2 for p in groups[0]["params"])
    assert "head.weight" in decayed and any(n.startswith("layers.1.") for n in decayed)
    assert "embedding.weight" in kept and "head.bias" in kept
    assert all(p.ndim == 1 for n, p in model.named_parameters() if n in kept and n != "embedding.weight")
    assert ("norm.weight" in kept) == layer_norm


def test_decay_all_is_one_group_of_every_parameter():
    """decay=all: one group, every parameter in model order (the embeddings included), the recipe's decay."""
    model = transformer(tie_head=True)
    groups = Recipe("original", weight_decay=0.03).parameter_groups(model)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.03
    params = groups[0]["params"]
    assert len(params) == len(list(model.parameters()))
    assert all(a is b for a, b in zip(params, model.parameters()))


def test_the_optimizer_is_adamw_with_the_recipes_betas_and_decays():
    """Recipe.optimizer: AdamW at lr with the recipe's betas and its groups' decays; one step with zero
    gradients shrinks exactly the decayed weights by (1 - lr x decay) and leaves the rest."""
    model = transformer(tie_head=False)
    lr, decay = 0.1, 0.5
    opt = Recipe("t", betas=[0.8, 0.95], weight_decay=decay, decay="matrices").optimizer(model, lr)
    assert type(opt) is torch.optim.AdamW
    assert [(g["lr"], g["betas"], g["weight_decay"]) for g in opt.param_groups] == \
        [(lr, (0.8, 0.95), decay), (lr, (0.8, 0.95), 0.0)]
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    for name, p in model.named_parameters():
        expected = before[name] * (1 - lr * decay) if id(p) in decayed else before[name]
        torch.testing.assert_close(p.detach(), expected, rtol=1e-6, atol=0)
    assert any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())

    original = shipped("original").optimizer(model, 3e-3)
    assert [(g["betas"], g["weight_decay"]) for g in original.param_groups] == [((0.9, 0.999), 0.01)]


# --- refused values ----------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [
    ("betas", [0.9]), ("betas", [0.9, 0.99, 0.999]), ("betas", [1.0, 0.99]), ("betas", [0.9, 1.5]),
    ("betas", [-0.1, 0.9]), ("weight_decay", -0.1), ("weight_decay", "much"), ("decay", "some"),
    ("warmup_steps", -1), ("warmup_steps", 2.5), ("floor", 1.0), ("floor", -0.1), ("interval", "day"),
])
def test_a_bad_value_is_refused_naming_its_key(key, value):
    """A UserError of one line naming optim.<key>, from Recipe and from the optim group alike."""
    for make in (lambda: Recipe("x", **{key: value}), lambda: Recipe.from_config({"name": "x", key: value})):
        with pytest.raises(UserError, match=rf"optim\.{key}=") as caught:
            make()
        assert "\n" not in str(caught.value)


def test_the_edges_of_the_allowed_values_are_accepted():
    """betas 0, decay 0, floor 0 and just below 1, warmup 0: all valid recipes."""
    Recipe("x", betas=(0, 0), weight_decay=0, floor=0.0, warmup_steps=0)
    recipe = Recipe("x", betas=[0.5, 0.999999], floor=0.999, warmup_steps=5, interval="step", decay="matrices")
    assert recipe.betas == (0.5, 0.999999)


def test_an_unknown_key_is_refused_naming_it():
    """optim.momentum (SGD's, not a recipe's setting): a UserError of one line naming it."""
    with pytest.raises(UserError, match="momentum") as caught:
        Recipe.from_config({**shipped("original").to_dict(), "momentum": 0.9})
    assert "\n" not in str(caught.value)


def test_validate_refuses_a_bad_recipe(compose_config, tiny_corpus):
    """optim.decay=bogus on the command line is refused before any work, naming the key."""
    validate(compose_config(f"data.path={tiny_corpus}"))  # the same config, valid
    with pytest.raises(UserError, match=r"optim\.decay='bogus'"):
        validate(compose_config(f"data.path={tiny_corpus}", "optim.decay=bogus"))


# --- which recipe a model gets ------------------------------------------------------------

@pytest.mark.parametrize("model", TRAINED_MODELS)
def test_every_trained_model_config_names_its_recipe(compose_config, model):
    """The transformers at the ladder's scales and nanoGPT's get the transformer recipe; every other model the
    original study's, as conf/optim/<name>.yaml writes it."""
    expected = "transformer" if model in TRANSFORMER_RECIPE else "original"
    cfg = compose_config(f"model={model}")
    assert cfg.optim.name == expected
    assert Recipe.from_config(cfg.optim) == shipped(expected)


@pytest.mark.parametrize("choice, expected", VARIANTS.items())
def test_every_variant_and_experiment_names_its_recipe(compose_config, choice, expected):
    """transformer_original and transformer_beta_original: the transformers under the original recipe."""
    assert Recipe.from_config(compose_config(choice).optim) == shipped(expected)


def test_the_recipes_list_is_the_study_ladder():
    """The parametrisation above covers the transformer configs and the recurrent ones."""
    assert {*TRANSFORMER_RECIPE, "astra_alpha", "scribe_alpha", "leviathan", "mlp"} <= set(TRAINED_MODELS)


@pytest.mark.parametrize("variant", ["astra_alpha_original", "transformer_original", "transformer_beta_original"])
def test_each_original_variant_is_its_base_model_at_the_original_studys_rate(compose_config, variant):
    """model=<variant>: the base model at the original study's learning rate (and, for the transformers, its
    recipe), under its own name (what tools/upgrade_run_folder.py renames model=<base>_seed to)."""
    cfg, base = compose_config(f"model={variant}"), compose_config(f"model={variant.removesuffix('_original')}")
    assert cfg.model.name == variant and cfg.optim.name == "original"
    assert cfg.model.lr == {"transformer_beta_original": 2e-3}.get(variant, 3e-3)
    assert cfg.model.architecture == base.model.architecture and cfg.data == base.data


@pytest.mark.parametrize("model, optim", [("transformer", "original"), ("astra_alpha", "transformer"),
                                          ("scribe_alpha", "transformer")])
def test_optim_on_the_command_line_beats_the_models_choice(compose_config, model, optim):
    """optim=... beats the model config's own recipe, and an optim.<key> beats the chosen file."""
    assert compose_config(f"model={model}", f"optim={optim}").optim.name == optim
    cfg = compose_config(f"model={model}", f"optim={optim}", "optim.floor=0.25")
    assert Recipe.from_config(cfg.optim) == dataclasses.replace(shipped(optim), floor=0.25)


# --- a tiny run ---------------------------------------------------------------------------

def test_a_transformer_run_warms_up_then_ends_at_the_floor(compose_config, tiny_corpus, monkeypatch):
    """model=transformer, 4 steps with 2 of warmup: lr/3, 2lr/3, lr, then halfway down the cosine, and
    floor x lr after the last step; AdamW with the recipe's betas and decays on the real optimiser."""
    used, groups, final = [], [], {}
    original = LanguageModelTask.training_step

    def training_step(self, batch, batch_idx):
        param_groups = self.optimizers().param_groups
        used.append(param_groups[0]["lr"])
        groups.append([(g["lr"], g["betas"], g["weight_decay"]) for g in param_groups])
        return original(self, batch, batch_idx)

    def on_train_end(self):
        final["lr"] = self.optimizers().param_groups[0]["lr"]

    monkeypatch.setattr(LanguageModelTask, "training_step", training_step)
    monkeypatch.setattr(LanguageModelTask, "on_train_end", on_train_end)
    cfg = compose_config(*TINY, f"data.path={tiny_corpus}", "model=transformer", "model.architecture.block_size=8",
                         "model.architecture.embedding_dim=8", "model.architecture.num_layers=1", "data.batch_size=4",
                         "data.seq_len=8", "trainer.max_steps=4", "optim.warmup_steps=2",
                         "checkpoint.every_n_steps=0", "evaluation.samples.chars=20")
    summary = train(cfg)
    lr, floor = cfg.model.lr, cfg.optim.floor
    assert summary["train_steps"] == 4 and len(used) == 4
    assert used == pytest.approx([lr / 3, 2 * lr / 3, lr, (lr + floor * lr) / 2], rel=1e-12)
    assert final["lr"] == pytest.approx(floor * lr, rel=1e-12)
    assert groups[0] == [(lr / 3, (0.9, 0.99), 0.1), (lr / 3, (0.9, 0.99), 0.0)]


# --- the schedule spans the training actually configured -------------------------------------

ON_TRAIN_BATCH_END = LanguageModelTask.on_train_batch_end


def fake_trainer(total_steps: int, per_epoch: int) -> SimpleNamespace:
    return SimpleNamespace(estimated_stepping_batches=total_steps, num_training_batches=per_epoch,
                           accumulate_grad_batches=1)


def optimizer(lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def learning_rates(opt, schedule, updates: int) -> list[float]:
    """The learning rate before each of `updates` steps, and after the last."""
    rates = []
    for _ in range(updates + 1):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
    return rates


@pytest.mark.parametrize("name", MODELS)
def test_full_recipe_schedule_is_bit_identical_to_the_studys(compose_config, name):
    """A full run (the model's epochs, no max_steps) gets exactly the study's schedule: torch's
    CosineAnnealingLR over the epochs, stepped once per epoch."""
    cfg = compose_config(f"model={name}")
    assert cfg.trainer.max_steps == -1 and recipe_length(cfg) == (cfg.model.epochs, cfg.model.steps_per_epoch)
    epochs, per_epoch = cfg.model.epochs, cfg.model.steps_per_epoch
    opt = optimizer(cfg.model.lr)
    schedule = Recipe.from_config(cfg.optim).schedule(opt, fake_trainer(epochs * per_epoch, per_epoch))
    assert schedule.interval == "epoch" and schedule.T_max == epochs
    reference_opt = optimizer(cfg.model.lr)
    reference = torch.optim.lr_scheduler.CosineAnnealingLR(reference_opt, T_max=epochs)
    assert learning_rates(opt, schedule, epochs) == learning_rates(reference_opt, reference, epochs)  # bit for bit


def test_a_step_count_gets_a_schedule_in_steps():
    opt = optimizer(3e-3)
    schedule = Recipe("seed").schedule(opt, fake_trainer(300, 200))  # max_steps=300: 1.5 epochs
    assert schedule.interval == "step" and schedule.T_max == 300
    rates = learning_rates(opt, schedule, 300)
    assert rates[0] == 3e-3 and rates[150] == pytest.approx(1.5e-3) and rates[-1] == 0.0
    assert all(a >= b for a, b in zip(rates, rates[1:]))


@pytest.mark.slow  # more than ~3 s on the 2-core CPU (pyproject's marker)
def test_a_300_step_run_ends_with_the_learning_rate_at_the_floor(compose_config, tiny_corpus, monkeypatch):
    """trainer.max_steps=300 of a 10-epoch x 200-step recipe: the schedule reaches its floor (0)
    at the end of the run, not near its peak as a schedule over the recipe's epochs would."""
    used, final = [], {}
    original = LanguageModelTask.training_step

    def training_step(self, batch, batch_idx):
        used.append(self.optimizers().param_groups[0]["lr"])
        return original(self, batch, batch_idx)

    def on_train_end(self):
        final["lr"] = self.optimizers().param_groups[0]["lr"]

    monkeypatch.setattr(LanguageModelTask, "training_step", training_step)
    monkeypatch.setattr(LanguageModelTask, "on_train_end", on_train_end)
    cfg = compose_config(*TINY, f"data.path={tiny_corpus}", "data.batch_size=2", "data.seq_len=8",
                         "model.architecture.hidden_size=16", "model.architecture.embedding_dim=8",
                         "trainer.max_steps=300", "model.epochs=10", "model.steps_per_epoch=200",
                         "checkpoint.every_n_steps=0")
    summary = train(cfg)
    assert summary["train_steps"] == 300 and len(used) == 300
    assert used[0] == cfg.model.lr and final["lr"] == 0.0  # the floor
    assert used[-1] < 1e-6  # the last steps already train at almost nothing
    assert all(a >= b for a, b in zip(used, used[1:]))


@pytest.mark.slow  # more than ~3 s on the 2-core CPU (pyproject's marker)
def test_a_resumed_step_schedule_continues_where_it_was(compose_config, tiny_corpus, tmp_path, monkeypatch):
    """trainer.max_steps=13 of 2 epochs x 8 steps (a schedule in steps), interrupted after step 11,
    resumed from the checkpoint of step 9: the same learning rates and results as in one go."""
    from test_resume import Interrupted, interrupt_at, summary_of, weights_of

    base = [*TINY, f"data.path={tiny_corpus}", "data.seq_len=16", "model.steps_per_epoch=8", "model.epochs=2",
            "trainer.max_steps=13", "checkpoint.every_n_steps=3"]
    rates = []
    original = LanguageModelTask.training_step
    monkeypatch.setattr(LanguageModelTask, "training_step", lambda self, batch, i: rates.append(
        (self.global_step, self.optimizers().param_groups[0]["lr"])) or original(self, batch, i))
    uninterrupted = tmp_path / "uninterrupted"
    train(compose_config(*base, f"paths.output_dir={uninterrupted}"))
    in_one_go, rates[:] = dict(rates), []

    interrupt_at(monkeypatch, 11)
    with pytest.raises(Interrupted):
        train(compose_config(*base))
    monkeypatch.setattr(LanguageModelTask, "on_train_batch_end", ON_TRAIN_BATCH_END)  # no more interruptions
    rates[:] = []
    summary = train(compose_config(*base, f"resume={tmp_path / 'run'}"))
    assert summary["train_steps"] == 13 and summary["resumed_from_step"] == 9
    assert dict(rates) == {step: in_one_go[step] for step in range(9, 13)}  # bit for bit
    assert in_one_go[12] < in_one_go[0] / 50  # near the floor at the end
    resumed, reference = summary_of(tmp_path / "run"), summary_of(uninterrupted)
    for key in ("train_loss", "val_loss", "stateful_nll", "stateless_nll"):
        assert resumed[key] == reference[key], key
    a, b = weights_of(tmp_path / "run"), weights_of(uninterrupted)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
