"""Sampling: the three inference modes are what they claim, decoding emits only allowed tokens,
seeds reproduce, the sampling settings are checked (validate_sampling), a pass without progress bars says what
runs, and sample.py works end to end."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO
from omegaconf import OmegaConf
from robustness_helpers import assert_untouched, error_line, fingerprint

from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.errors import UserError
from gru_experiments.models.ngram import NGramLM
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.study import generation
from gru_experiments.study.generation import (
    STUDY_PROMPTS,
    Decoding,
    Progress,
    check_generation_fits,
    filter_logits,
    generate,
    generation_bytes,
    make_chooser,
    sample_texts,
    sample_tokens,
    spellable_prompts,
    validate_sampling,
)
from gru_experiments.study.modes import MODES_BY_CONTEXT

V = 13


def make_model(cell="gru", num_layers=3, seed=0, **kwargs) -> RecurrentLM:
    torch.manual_seed(seed)
    # Dropout > 0 on purpose: eval mode must switch it off, or nothing below would agree.
    return RecurrentLM(V, cell, embedding_dim=6, hidden_size=10, num_layers=num_layers, dropout=0.3, **kwargs).eval()


class Scripted:
    """A `choose` that records the logits it is shown and answers with fixed tokens."""

    def __init__(self, tokens: torch.Tensor):
        self.tokens, self.seen = tokens, []

    def __call__(self, logits):
        self.seen.append(logits.clone())
        return self.tokens[:, len(self.seen) - 1]


MODELS = [dict(cell="gru"), dict(cell="lstm"), dict(cell="lstm", layer_norm=True),
          dict(cell="gru", implementation="reference")]


@pytest.mark.parametrize("kwargs", MODELS, ids=lambda k: "-".join(map(str, k.values())))
def test_stepping_with_carried_state_equals_one_full_forward(kwargs):
    model = make_model(**kwargs)
    tokens = torch.randint(V, (2, 15))
    with torch.no_grad():
        full, full_state = model(tokens)
        # A prefix in one pass, then one token at a time: how the stateful sampler runs.
        prefix, state = model(tokens[:, :5])
        steps = [prefix]
        for t in range(5, 15):
            logits, state = model(tokens[:, t:t + 1], state)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full)
    for ours, reference in zip(state, full_state):
        torch.testing.assert_close(ours, reference)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_stateful_sampler_sees_the_whole_history(cell):
    model = make_model(cell)
    prompt, chosen = torch.randint(V, (3, 6)), torch.randint(V, (3, 9))
    script = Scripted(chosen)
    out = sample_tokens(model, prompt, 9, "stateful", script)
    assert torch.equal(out, chosen)
    with torch.no_grad():
        full, _ = model(torch.cat([prompt, chosen], 1))
    # Step t sees the prompt and the t tokens chosen so far: the full forward at that position.
    torch.testing.assert_close(torch.stack(script.seen, 1), full[:, 5:14])


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_stateless_sampler_is_the_model_on_the_last_token_from_zero_state(cell):
    model = make_model(cell)
    prompt, chosen = torch.randint(V, (3, 6)), torch.randint(V, (3, 7))
    script = Scripted(chosen)
    sample_tokens(model, prompt, 7, "stateless", script)
    previous = torch.cat([prompt[:, -1:], chosen[:, :-1]], 1)
    with torch.no_grad():
        for t, seen in enumerate(script.seen):
            zeros = model.initial_state(3)
            expected, _ = model(previous[:, t:t + 1], zeros)
            torch.testing.assert_close(seen, expected[:, -1])
    # ...which depends on nothing before the last token.
    other_prompt = torch.cat([torch.randint(V, (3, 4)), prompt[:, -1:]], 1)
    again = Scripted(chosen)
    sample_tokens(model, other_prompt, 7, "stateless", again)
    torch.testing.assert_close(torch.stack(again.seen), torch.stack(script.seen))


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_windowed_sampler_is_the_full_forward_on_the_window(cell):
    model = make_model(cell)
    window = 4
    prompt, chosen = torch.randint(V, (2, 6)), torch.randint(V, (2, 5))
    script = Scripted(chosen)
    sample_tokens(model, prompt, 5, "windowed", script, window=window)
    sequence = torch.cat([prompt, chosen], 1)
    with torch.no_grad():
        for t, seen in enumerate(script.seen):
            end = 6 + t
            expected, _ = model(sequence[:, end - window:end])
            torch.testing.assert_close(seen, expected[:, -1])
        # A window longer than the history is the history: the stateful figure.
        long_script = Scripted(chosen)
        sample_tokens(model, prompt, 5, "windowed", long_script, window=100)
        full, _ = model(sequence)
    torch.testing.assert_close(torch.stack(long_script.seen, 1), full[:, 5:10])


def test_sampling_restores_training_mode():
    model = make_model().train()
    generate(model, [1, 2], mode="stateful", max_new_tokens=3)
    assert model.training


@pytest.mark.parametrize("mode", ["stateful", "stateless", "windowed"])
def test_same_seed_same_text_different_seed_different_text(mode):
    model = make_model()
    draw = lambda seed: generate(model, [1, 2, 3], mode=mode, max_new_tokens=40, num_samples=3,  # noqa: E731
                                 decoding=Decoding(temperature=1.0), seed=seed, window=5)
    first = draw(7)
    assert first.shape == (3, 40)
    assert torch.equal(first, draw(7))
    assert not torch.equal(first, draw(8))
    assert not torch.equal(first[0], first[1])  # the batch's samples are independent draws


def test_a_prompts_text_does_not_depend_on_the_other_prompts():
    tokenizer = CharTokenizer("ABCDEFGHIJKLM")
    model = make_model()
    alone = sample_texts(model, tokenizer, ["AB"], mode="stateful", max_new_tokens=30, seed=3)
    together = sample_texts(model, tokenizer, ["CD", "AB"], mode="stateful", max_new_tokens=30, seed=3)
    assert together[1] == alone[0] and alone[0][0].startswith("AB") and len(alone[0][0]) == 32
    assert together[0] != together[1]


def allowed_top_k(logits, k):
    return set(torch.argsort(logits, descending=True)[:k].tolist())


def allowed_top_p(logits, p):
    """Smallest set of most probable tokens whose probabilities reach p, written out plainly."""
    probs = torch.softmax(logits.double(), -1).tolist()
    kept, mass = set(), 0.0
    for token in sorted(range(len(probs)), key=lambda i: -probs[i]):
        kept.add(token)
        mass += probs[token]
        if mass >= p:
            break
    return kept


@pytest.mark.parametrize("top_k,top_p", [(5, None), (None, 0.5), (None, 0.9), (8, 0.6), (1, None)])
def test_top_k_and_top_p_only_ever_emit_allowed_tokens(top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(4, 40) * 2
    filtered = filter_logits(logits, 0.7, top_k, top_p)
    scaled = logits / 0.7
    for row in range(4):
        allowed = set(range(40))
        if top_k is not None:
            allowed = allowed_top_k(scaled[row], top_k)
        if top_p is not None:
            renormalised = scaled[row].masked_fill(torch.tensor([i not in allowed for i in range(40)]), -float("inf"))
            allowed = allowed_top_p(renormalised, top_p)
        assert set(torch.nonzero(filtered[row].isfinite()).flatten().tolist()) == allowed
        # Draws through the chooser, many at once.
        choose = make_chooser(Decoding(temperature=0.7, top_k=top_k, top_p=top_p),
                              torch.Generator().manual_seed(row))
        draws = choose(logits[row].expand(5000, -1))
        assert set(draws.tolist()) <= allowed
        assert len(set(draws.tolist())) > 1 or len(allowed) == 1


def test_greedy_is_the_argmax():
    torch.manual_seed(1)
    logits = torch.randn(6, 30)
    assert torch.equal(make_chooser(Decoding(greedy=True))(logits), logits.argmax(-1))
    assert torch.equal(make_chooser(Decoding(temperature=0))(logits), logits.argmax(-1))
    # Greedy stateful sampling is the argmax of the full forward at every step.
    model = make_model("lstm")
    out = generate(model, [3, 1, 4], mode="stateful", max_new_tokens=12, decoding=Decoding(greedy=True))
    sequence = torch.tensor([[3, 1, 4]])
    with torch.no_grad():
        for _ in range(12):
            logits, _ = model(sequence)
            sequence = torch.cat([sequence, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, sequence[:, 3:])


def test_decoding_rejects_nonsense():
    for bad in [dict(temperature=-1), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)]:
        with pytest.raises(UserError, match=f"invalid {next(iter(bad))}="):
            Decoding(**bad)


# --- requests that cannot be served ---------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(num_samples=0), "invalid num_samples=0: must be an integer >= 1"),
    (dict(max_new_tokens=-5), "invalid max_new_tokens=-5: must be an integer >= 1"),
    (dict(mode="windowed", window=0), "invalid window=0: must be null or an integer >= 1"),
])
def test_generate_refuses_nonsense_sizes(kwargs, message):
    args = dict(mode="stateful", max_new_tokens=3) | kwargs
    with pytest.raises(UserError) as info:
        generate(make_model(), [1, 2], **args)
    assert str(info.value).startswith(message)


def test_generate_refuses_a_request_larger_than_memory_before_allocating(monkeypatch):
    model = make_model()
    allocations = []
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda *a, **k: allocations.append(a) or pytest.fail("allocated"))
    with pytest.raises(UserError) as info:
        generate(model, [1, 2, 3], mode="stateful", max_new_tokens=100_000_000, num_samples=100_000)
    message = str(info.value)
    assert message.startswith("num_samples=100000 x (prompt 3 + max_new_tokens=100000000) tokens would need 72.8 TiB "
                              "for the token buffer alone; this machine has ")
    assert message.endswith("of memory; ask for fewer samples (num_samples) or fewer tokens (max_new_tokens)")
    assert not allocations


def test_memory_check_counts_logits_window_and_state(monkeypatch):
    model = make_model()  # V = 13, 3 GRU layers of 10
    parts = generation_bytes(model, 4, 100, 8, "stateful")
    assert parts == {"token buffer": 8 * 104 * 8, "logits": 8 * 4 * V * 4, "probabilities": 8 * V * 4,
                     "model state": 8 * 3 * 10 * 4}
    assert generation_bytes(model, 4, 100, 8, "stateless")["logits"] == 8 * 1 * V * 4
    assert generation_bytes(model, 4, 100, 8, "windowed", window=50)["logits"] == 8 * 50 * V * 4
    assert generation_bytes(model, 4, 100, 8, "windowed", window=10**6)["logits"] == 8 * 103 * V * 4  # the history
    ngram = NGramLM(V, order=3)
    assert generation_bytes(ngram, 4, 100, 8, "windowed", window=50)["logits"] == 8 * 2 * V * 4  # its context
    assert generation_bytes(ngram, 4, 100, 8, "stateful")["model state"] == 8 * 2 * 8  # its last 2 token ids
    # A machine of 1 MiB: the token buffer fits, the windowed logits do not.
    monkeypatch.setattr(generation, "memory_available", lambda device: (1 << 20, "this machine has 1.0 MiB of memory"))
    check_generation_fits(model, 4, 10_000, 8, "stateless")
    with pytest.raises(UserError) as info:
        check_generation_fits(model, 4, 10_000, 8, "windowed", window=5000)
    assert str(info.value) == (
        "num_samples=8 x (prompt 4 + max_new_tokens=10000) tokens, window=5000 in windowed mode would need at least "
        "2.6 MiB (token buffer 625.2 KiB, logits 2.0 MiB, probabilities 416 bytes, model state 960 bytes); this "
        "machine has 1.0 MiB of memory; ask for fewer samples (num_samples) or fewer tokens (max_new_tokens) or a "
        "shorter window (evaluation.window)")


def test_memory_on_cuda_is_the_free_device_memory_plus_torch_cached(monkeypatch):
    # No GPU needed: the CUDA calls the check makes, answered as a busy 80 GiB device would.
    GiB = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * GiB, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 6 * GiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 4 * GiB)
    assert generation.memory_available("cuda:0") == (12 * GiB, "cuda:0 has 12.0 GiB free of 80.0 GiB")


def test_normal_requests_pass_the_memory_check():
    # The largest model of the study at sample.py's documented scale: 100 samples x 2000 tokens, every mode.
    model = RecurrentLM(1000, "lstm", embedding_dim=256, hidden_size=1024, num_layers=3)
    for mode in ("stateful", "stateless", "windowed"):
        check_generation_fits(model, 20, 2000, 100, mode, window=256)
    assert generation.memory_available("cpu")[0] > 1 << 30


# --- sample.py end to end ------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, small_shakespeare):
    """A two-step Astra-alpha run, in an outputs/ folder of its own."""
    from hydra import compose, initialize_config_dir
    from robustness_helpers import train

    root = tmp_path_factory.mktemp("sample_e2e")
    run_dir = root / "outputs" / "runs" / "astra_alpha" / "run1"
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            f"paths.output_dir={run_dir}", f"paths.data_dir={root / 'data'}", f"paths.log_dir={root / 'outputs'}",
            "logger=none", f"data.path={small_shakespeare}", "data.batch_size=4", "data.seq_len=32",
            "trainer.max_steps=2", "model.steps_per_epoch=2", "trainer.enable_progress_bar=false",
            "trainer.accelerator=cpu", "evaluation.samples.chars=20"])
    train(cfg)
    return root, run_dir


def run_sample(root: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PROJECT_ROOT=str(root), PYTHONPATH=str(REPO), WANDB_MODE="disabled")
    return subprocess.run([sys.executable, str(REPO / "sample.py"), f"paths.log_dir={root / 'outputs'}",
                           "device=cpu", *overrides], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def sampling_dirs(root: Path) -> list[Path]:
    return sorted((root / "outputs" / "samples").glob("*/*/"))


@pytest.mark.slow
def test_sample_py_stateful_and_stateless(trained_run):
    root, run_dir = trained_run
    # Default: the newest astra_alpha run under outputs/, stateful, the study's prompts.
    result = run_sample(root, "max_new_tokens=25", "num_samples=2")
    assert result.returncode == 0, result.stderr
    for prompt in STUDY_PROMPTS:
        assert f"=== {prompt!r} [stateful, sample 2/2]" in result.stdout
    [first] = sampling_dirs(root)
    record = json.loads((first / "sampling.json").read_text())
    assert record["checkpoint"] == str((run_dir / "checkpoints" / "last.ckpt").resolve())
    assert record["settings"]["mode"] == "stateful" and record["seed"] == 1234
    assert [r["prompt"] for r in record["results"]] == list(STUDY_PROMPTS)
    assert all(len(r["samples"]) == 2 for r in record["results"])
    assert record["results"][0]["samples"][0] in (first / "samples.txt").read_text()

    # Stateless from the run folder, one prompt from the command line.
    result = run_sample(root, f"run={run_dir}", "inference=stateless", "prompt=ROMEO: ", "max_new_tokens=25")
    assert result.returncode == 0, result.stderr
    assert "=== 'ROMEO: ' [stateless, sample 1/1]" in result.stdout
    [second] = [d for d in sampling_dirs(root) if d != first]
    record = json.loads((second / "sampling.json").read_text())
    assert record["settings"]["mode"] == "stateless" and record["prompts"] == ["ROMEO: "]
    assert record["results"][0]["samples"][0].startswith("ROMEO: ")


@pytest.mark.slow
def test_sample_py_windowed_with_evaluation(trained_run, small_shakespeare):
    root, run_dir = trained_run
    prompts = root / "prompts.txt"
    prompts.write_text("KING: \nJULIET:\\nO Romeo\n", encoding="utf-8")
    result = run_sample(root, f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", "inference=windowed",
                        f"prompt_file={prompts}", "max_new_tokens=10", "top_k=5", "evaluate=true",
                        f"data.path={small_shakespeare}", "data.seq_len=32")
    assert result.returncode == 0, result.stderr
    assert "=== 'JULIET:\\nO Romeo' [windowed" in result.stdout
    assert "inference modes on " in result.stdout
    assert "evaluation: stateful" in result.stderr  # the progress bars
    newest = max(sampling_dirs(root), key=lambda d: d.name)
    record = json.loads((newest / "sampling.json").read_text())
    assert record["prompts"] == ["KING: ", "JULIET:\nO Romeo"] and record["settings"]["window"] == 32
    evaluation = json.loads((newest / "evaluation.json").read_text())
    for mode in ["stateful", "stateless", "windowed", "bigram"]:
        assert evaluation[f"{mode}_bpc"] > 0 and evaluation[f"{mode}_nll"] > 0
    # The same figures the training run recorded: the same weights, data and plan (its budget is a
    # multiple of the run's own training tokens, read from its summary).
    summary = json.loads((run_dir / "summary.json").read_text())
    assert evaluation["settings"]["plan"] == summary["mode_evaluation"]["plan"]
    for key in ["stateful_nll", "stateless_nll", "windowed_nll", "bigram_nll", "cache_gain_bpc"]:
        assert evaluation[key] == pytest.approx(summary[key], rel=1e-5)
    for size, figures in summary["cache"]["by_size"].items():  # the cache, rescored
        assert evaluation["cache"]["by_size"][size]["bpc"] == pytest.approx(figures["bpc"], rel=1e-5)
    assert "continuous cache over the last N tokens" in result.stdout
    # ... and the same context curve, point by point.
    assert set(evaluation["context_curve"]) == set(summary["context_curve"])
    for key, value in summary["context_curve"].items():
        if key not in ("settings", "by_class"):
            assert evaluation["context_curve"][key] == pytest.approx(value, rel=1e-5), key
    by_class = evaluation["context_curve"]["by_class"]
    assert {name: c["targets"] for name, c in by_class.items()} == {
        name: c["targets"] for name, c in summary["context_curve"]["by_class"].items()}
    assert "context curve" in result.stdout


@pytest.mark.slow
def test_sample_py_dynamic_adapts_to_the_prompt_and_evaluates_the_dynamic_figure(trained_run, small_shakespeare):
    """inference=dynamic: the weights adapted to each prompt (the run's evaluation.dynamic, here sgd), the
    settings recorded; lr=0 samples the stateful text; evaluate=true gives the run's own dynamic figure."""
    import torch

    root, run_dir = trained_run
    before = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    common = (f"run={run_dir}", "prompt=ROMEO: O Romeo Romeo wherefore art thou Romeo", "max_new_tokens=20",
              "evaluation.dynamic.rule=sgd", "evaluation.dynamic.segment=8")
    adapted = run_sample(root, *common, "inference=dynamic", "evaluation.dynamic.lr=0.5")
    assert adapted.returncode == 0, adapted.stderr
    bars = adapted.stderr.replace("\r", "\n")  # the adaptation's own bar, then the sampling's
    assert re.search(r"sampling 'ROMEO: O Romeo.*: the weights adapting to the prompt: 100%.*44.0/44.0.*\n(.*\n)*"
                     r"sampling 'ROMEO: .*: stateful: 100%", bars), bars[-2000:]
    record = json.loads((max(sampling_dirs(root), key=lambda d: d.name) / "sampling.json").read_text())
    assert record["settings"]["mode"] == "dynamic" and record["settings"]["dynamic"]["lr"] == 0.5
    stateful = run_sample(root, *common, "inference=stateful")
    still = run_sample(root, *common, "inference=dynamic", "evaluation.dynamic.lr=0", "evaluate=true",
                       "evaluation.budget=100", f"data.path={small_shakespeare}")  # 2 steps: room for both exact
    sample = [t.split("sample 1/1]\n", 1)[1].split("\n\n", 1)[0] for t in (adapted.stdout, still.stdout,
                                                                             stateful.stdout)]
    assert sample[1] == sample[2] != sample[0]  # lr = 0: the stateful text; lr = 0.5: another
    evaluation = json.loads((max(sampling_dirs(root), key=lambda d: d.name) / "evaluation.json").read_text())
    assert evaluation["dynamic_bpc"] == pytest.approx(evaluation["stateful_bpc"], abs=1e-6)
    after = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_sample_py_stats_prints_the_table_and_writes_stats_json(trained_run, small_shakespeare):
    """stats=true: the text statistics of every mode x decoder (study/text_protocol.py), printed as a
    table and saved in stats.json with the texts they come from; the training split's index is
    counted once and kept in paths.data_dir."""
    from gru_experiments.study.text_index import TrainingIndex
    from gru_experiments.study.text_protocol import DECODERS
    from gru_experiments.study.text_stats import STATISTICS, text_statistics

    root, run_dir = trained_run
    result = run_sample(root, f"run={run_dir}", "prompt=KING: ", "max_new_tokens=5", "stats=true",
                        "evaluation.text.samples=4", "evaluation.text.chars=60", "evaluation.text.drift_chars=500",
                        f"data.path={small_shakespeare}", "data.seq_len=32")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("text statistics: 4 samples of 60 characters per setting") for line in lines)
    assert any(line.split() == ["setting", *STATISTICS] for line in lines)
    rows = {line[:26].strip() for line in lines}
    assert {f"{mode} {decoder}" for mode in MODES_BY_CONTEXT for decoder in DECODERS} <= rows
    assert {"reference (validation)", "random (floor)", "looped (ceiling)"} <= rows
    assert any(line.startswith("drift: 2 generations of 500 characters") for line in lines)
    assert "text statistics: windowed (32)" in result.stderr  # the progress bars; the run's window
    newest = max(sampling_dirs(root), key=lambda d: d.name)
    record = json.loads((newest / "stats.json").read_text())
    assert record["settings"]["window"] == 32 and record["settings"]["seed"] == 1234
    assert record["settings"]["prompts"] == [[p, n] for p, n in zip(STUDY_PROMPTS, (2, 1, 1))]  # the study's
    [cached] = (root / "data").glob("text_index_*.pt")
    index = TrainingIndex.from_state_dict(torch.load(cached, weights_only=True))
    texts = record["texts"]
    for mode in MODES_BY_CONTEXT:
        for decoder in DECODERS:
            assert text_statistics(texts[mode][decoder], index, texts["reference"]) == record["modes"][mode][decoder]

    # samples longer than the validation split cannot have a reference: refused in one line, before sampling
    before = sampling_dirs(root)
    result = run_sample(root, f"run={run_dir}", "stats=true", "evaluation.text.chars=10000",
                        f"data.path={small_shakespeare}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert error_line(result.stderr).startswith(
        "error: invalid evaluation.text.chars=10000: the reference is slices of the validation split as long as the "
        "samples, and the validation split of ")
    assert error_line(result.stderr).endswith("has 6,000 characters") and sampling_dirs(root) == before


@pytest.mark.parametrize("model", ["astra_beta", "astra_alpha_original"])  # a model; a variant (conf/model/)
def test_sample_py_without_a_checkpoint_says_how_to_train_one(tmp_path, compose_config, model):
    result = run_sample(tmp_path, f"model={model}")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: no trained {model} checkpoint under outputs/; "
        f"train one with: python train.py model={model}")
    assert not (tmp_path / "outputs" / "samples").exists()  # a failed start leaves no folder behind
    assert compose_config(f"model={model}").model.name == model  # the command it suggests composes that model


def test_end_of_training_prompts_fall_back_to_what_the_vocabulary_spells():
    tokenizer = CharTokenizer("ABCIKNG: ")
    assert spellable_prompts(tokenizer, STUDY_PROMPTS, torch.tensor([0])) == ["KING: "]
    tokenizer = CharTokenizer("abc")
    assert spellable_prompts(tokenizer, STUDY_PROMPTS, torch.tensor([2, 1, 0, 0, 1, 2, 2, 2, 2])) == ["cbaabccc"]


@pytest.mark.parametrize("overrides, message", [
    (["temperature=-0.5"], "error: invalid temperature=-0.5: must be a number >= 0 (0: greedy, the argmax)"),
    (["temperature=null"], "error: invalid temperature=None: must be a number >= 0"),
    (["top_k=0"], "error: invalid top_k=0: must be null (off) or an integer from 1 to the vocabulary size"),
    (["top_p=1.5"], "error: invalid top_p=1.5: must be null (off) or a number in (0, 1]"),
    (["prompt='ROMEO ✓: '"], "error: the prompt has characters this model's char vocabulary lacks: '✓' (U+2713); "
                           "remove them, or drop them with drop_unknown=true"),
    (["max_new_tokens=-5"], "error: invalid max_new_tokens=-5: must be an integer >= 1"),
    (["num_samples=0"], "error: invalid num_samples=0: must be an integer >= 1"),
    (["inference=windowed", "evaluation.window=0"], "error: invalid evaluation.window=0: must be null (the training "
                                                     "data.seq_len) or an integer >= 1"),
    (["stats=true", "evaluation.text.samples=0"], "error: stats=true measures evaluation.text.samples samples per "
                                                "setting, which is 0: give an integer >= 1"),
    (["evaluation.text.chars=31"], "error: invalid evaluation.text.chars=31: must be an integer from 32"),
    (["max_new_tokens=100000000", "num_samples=100000"],
     "error: num_samples=100000 x (prompt 15 + max_new_tokens=100000000) tokens would need 72.8 TiB for the token "
     "buffer alone; this machine has "),
])
@pytest.mark.slow
def test_sample_py_refuses_bad_settings_before_sampling(trained_run, overrides, message):
    root, _ = trained_run
    before, files = sampling_dirs(root), fingerprint(root)
    size = [] if any(o.startswith("max_new_tokens=") for o in overrides) else ["max_new_tokens=5"]
    result = run_sample(root, *size, *overrides)
    assert result.returncode == 2, result.stderr[-2000:]
    assert error_line(result.stderr).startswith(message)
    assert sampling_dirs(root) == before  # no run folder left
    assert_untouched(files, fingerprint(root))  # nothing written anywhere


@pytest.mark.slow
def test_sample_py_temperature_0_is_greedy(trained_run):
    """temperature=0 means the argmax, in sample.py as in Decoding and evaluation.samples.temperature
    (one rule: validation.temperature_rule); its text is greedy=true's, whatever the seed."""
    from gru_experiments.api import load

    root, run_dir = trained_run
    result = run_sample(root, f"run={run_dir}", "prompt=ROMEO: ", "max_new_tokens=20", "temperature=0", "seed=7")
    assert result.returncode == 0, result.stderr
    newest = max(sampling_dirs(root), key=lambda d: d.name)
    record = json.loads((newest / "sampling.json").read_text())
    assert record["settings"]["temperature"] == 0
    greedy = load(run_dir).generate("ROMEO: ", max_new_tokens=20, greedy=True, seed=1)
    assert record["results"][0]["samples"] == [greedy]


def test_one_temperature_rule_for_sample_py_and_the_run_config():
    from gru_experiments.study.evaluation import SampleConfig
    from gru_experiments.validation import temperature_rule

    generation.validate_sampling({"temperature": 0}, vocab_size=65)  # greedy
    [rule] = [r for r in SampleConfig.RULES if r.key == "temperature"]  # evaluation.samples.temperature
    assert rule == temperature_rule("temperature")
    assert Decoding(temperature=0).is_greedy
    with pytest.raises(UserError, match=r"invalid temperature=-1: must be a number >= 0 \(0: greedy, the argmax\)"):
        Decoding(temperature=-1)


@pytest.mark.slow
def test_sample_py_drops_unknown_prompt_characters_when_asked(trained_run):
    root, _ = trained_run
    result = run_sample(root, "max_new_tokens=5", "prompt='ROMEO ✓: '", "drop_unknown=true")
    assert result.returncode == 0, result.stderr
    assert "=== 'ROMEO : ' [stateful, sample 1/1]" in result.stdout


def test_without_progress_bars_each_pass_says_what_runs(capsys):
    with Progress(enabled=False, lines=True).phase("recall, windowed (1,000 targets)", 7_470_000) as tick:
        tick(10)
    assert capsys.readouterr().out == "evaluation: recall, windowed (1,000 targets), 7,470,000 tokens\n"
    with Progress(enabled=False).phase("stateful", 10):
        pass
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("settings, expected", [
    ({"temperature": -1.5}, "invalid temperature=-1.5: must be a number >= 0 (0: greedy, the argmax)"),
    ({"temperature": None}, "invalid temperature=None: must be a number >= 0"),
    ({"top_k": 0}, "invalid top_k=0: must be null (off) or an integer from 1 to the vocabulary size 65"),
    ({"top_k": 66}, "invalid top_k=66"),
    ({"top_p": 0.0}, "invalid top_p=0.0: must be null (off) or a number in (0, 1]"),
    ({"top_p": 1.5}, "invalid top_p=1.5"),
    ({"num_samples": 0}, "invalid num_samples=0: must be an integer >= 1"),
    ({"num_samples": 2.5}, "invalid num_samples=2.5: must be an integer >= 1"),
    ({"num_samples": None}, "invalid num_samples=None: must be an integer >= 1"),
    ({"max_new_tokens": -5}, "invalid max_new_tokens=-5: must be an integer >= 1"),
    ({"max_new_tokens": 0}, "invalid max_new_tokens=0: must be an integer >= 1"),
    ({"max_new_tokens": "many"}, "invalid max_new_tokens='many': must be an integer >= 1"),
    ({"window": 0}, "invalid window=0: must be null or an integer >= 1"),
    ({"window": True}, "invalid window=True"),
    ({"seed": "lucky"}, "invalid seed='lucky': must be an integer"),
    ({"greedy": "yes"}, "invalid greedy='yes': must be true or false"),
])
def test_validate_sampling_rejects(settings, expected):
    with pytest.raises(UserError) as info:
        validate_sampling(settings, vocab_size=65)
    assert str(info.value).startswith(expected)


def test_validate_sampling_accepts_and_names_keys_with_prefix():
    validate_sampling({"temperature": 0.8, "top_k": 65, "top_p": 1.0}, vocab_size=65)
    validate_sampling({"temperature": 1, "top_k": None, "top_p": None}, vocab_size=65)
    validate_sampling({"temperature": 0}, vocab_size=65)  # 0: greedy, the argmax
    with pytest.raises(UserError, match=r"invalid sample\.top_k=1000"):
        validate_sampling({"top_k": 1000}, vocab_size=65, prefix="sample.")
    # The sizes: absent keys are skipped, a window may be null (the caller's default).
    validate_sampling({"num_samples": 1, "max_new_tokens": 1, "window": None, "seed": -3, "greedy": True}, 65)
    validate_sampling({"num_samples": 100, "max_new_tokens": 2000, "window": 256}, 65)
    # Before the checkpoint is read the vocabulary is unknown: top_k is only checked to be >= 1.
    validate_sampling({"top_k": 1000}, vocab_size=None)
    with pytest.raises(UserError, match=r"invalid top_k=0: must be null \(off\) or an integer from 1 to the "
                                        r"vocabulary size$"):
        validate_sampling({"top_k": 0}, vocab_size=None)
    # A DictConfig (sample.py's whole config) reads the same.
    with pytest.raises(UserError, match=r"invalid evaluation\.window=0"):
        validate_sampling(OmegaConf.create({"window": 0}), None, prefix="evaluation.")
