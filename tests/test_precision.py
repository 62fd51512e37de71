"""The bf16 matmul path (models/precision.py, models/fast_recurrence/) against the float32 reference.

bf16 keeps 8 significand bits: each matmul input is rounded with a relative error up to
2^-9 ≈ 0.2%, and each matmul output too (the CPU kernels accumulate in fp32 but return
bf16). Measured at these shapes, outputs and gradients land within ~0.5% of the float32
reference (relative L2 error). The tolerance stated and tested here:

    relative L2 error ≤ BF16_RTOL = 2e-2 for outputs, final states and every gradient,

four times what we measure, and 10^3 times looser than the float32 fast path's 1e-5 (a
wrong formula gives errors of order 1). The tests also check that the bf16 path is really
taken (its results are not bit-equal to float32) and that the weights are cast once per
sequence, not once per step.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gru_experiments.models.precision as precision
from gru_experiments.models.cells import GRULayer, LSTMLayer, RNNLayer
from gru_experiments.models.mlp import BengioMLP
from gru_experiments.models.precision import MatmulPrecision, describe, resolve
from gru_experiments.models.recurrent import RecurrentLM

BF16_RTOL = 2e-2
CELLS = {"gru": GRULayer, "lstm": LSTMLayer, "rnn": RNNLayer}


def flatten_state(state):
    if isinstance(state, torch.Tensor):
        return [state]
    return [t for s in state for t in flatten_state(s)]


def weighted_loss(tensors, seed=123):
    g = torch.Generator().manual_seed(seed)
    return sum((t.float() * torch.randn(t.shape, generator=g)).sum() for t in tensors)


def assert_close_bf16(actual, expected, name=""):
    assert actual.dtype == expected.dtype, name
    err = (actual - expected).norm() / expected.norm().clamp_min(1e-12)
    assert err <= BF16_RTOL, f"{name}: relative error {err:.4f} > {BF16_RTOL}"


def layer_pair(cell, input_size, hidden_size, device="cpu"):
    torch.manual_seed(0)
    reference = CELLS[cell](input_size, hidden_size, "reference").to(device)
    fast = CELLS[cell](input_size, hidden_size, "fast").to(device)
    fast.load_state_dict(reference.state_dict())
    fast.matmul_precision = MatmulPrecision()
    return reference, fast


def make_state(cell, batch, hidden, device="cpu"):
    h = torch.randn(batch, hidden, device=device, requires_grad=True)
    return h if cell != "lstm" else (h, torch.randn(batch, hidden, device=device, requires_grad=True))


def compare_layer(cell, device="cpu"):
    reference, fast = layer_pair(cell, 24, 48, device)
    torch.manual_seed(1)
    x = torch.randn(6, 40, 24, device=device, requires_grad=True)
    state = make_state(cell, 6, 48, device)
    leaves = [x, *flatten_state(state)]
    results = []
    for layer in (reference, fast):
        y, final = layer(x, state)
        out = [y, *flatten_state(final)]
        grads = torch.autograd.grad(weighted_loss(out), [*leaves, *layer.parameters()])
        results.append((out, grads))
    names = ["outputs", *(f"final state {i}" for i in range(len(results[0][0]) - 1)), "x",
             *(f"state {i}" for i in range(len(leaves) - 1)), *(n for n, _ in reference.named_parameters())]
    for name, a, b in zip(names, [*results[1][0], *results[1][1]], [*results[0][0], *results[0][1]], strict=True):
        assert_close_bf16(a, b, name)
    assert not torch.equal(results[1][0][0], results[0][0][0])  # the bf16 path was taken


@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
def test_bf16_layer_matches_float32_reference(cell):
    compare_layer(cell)


@pytest.mark.parametrize("cell,layer_norm", [("gru", False), ("lstm", True), ("rnn", False)])
def test_bf16_model_matches_float32_reference(cell, layer_norm):
    """Whole model: embedding, three layers, [LayerNorm], head; logits and every parameter's gradient."""
    torch.manual_seed(0)
    reference = RecurrentLM(50, cell, 16, 32, num_layers=3, dropout=0.0, layer_norm=layer_norm,
                            implementation="reference")
    fast = RecurrentLM(50, cell, 16, 32, num_layers=3, dropout=0.0, layer_norm=layer_norm)
    fast.load_state_dict(reference.state_dict())
    fast.set_matmul_precision(MatmulPrecision())
    assert "head.weight" in fast.low_precision_weights()
    tokens = torch.randint(0, 50, (5, 30))
    outs, grads = [], []
    for model in (reference, fast):
        logits, _ = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), tokens.reshape(-1))
        outs.append(logits)
        grads.append(torch.autograd.grad(loss, list(model.parameters())))
    assert outs[1].dtype == torch.float32
    assert_close_bf16(outs[1], outs[0], "logits")
    for (name, _), a, b in zip(reference.named_parameters(), grads[1], grads[0], strict=True):
        assert a.dtype == torch.float32, name
        assert_close_bf16(a, b, name)
    with torch.no_grad():  # evaluation runs the same bf16 forward
        torch.testing.assert_close(fast(tokens)[0], outs[1].detach())


def test_per_shape_choice_and_float32_default():
    model = RecurrentLM(65, "gru", 64, 256, num_layers=2)
    assert model.low_precision_weights() == []  # float32 unless asked
    model.set_matmul_precision(MatmulPrecision(min_weight_elements=65_536))
    # 256x256 (candidate) and up; not 768x64 (layer 0's input side) nor the 65x256 head
    assert model.low_precision_weights() == [
        "layers.0.hidden_weight_rz", "layers.0.hidden_weight_candidate", "layers.1.input_weight",
        "layers.1.hidden_weight_rz", "layers.1.hidden_weight_candidate"]
    assert describe("32-true", "auto", model)["matmul_dtype"] == "bfloat16+float32"
    model.set_matmul_precision(MatmulPrecision())
    assert describe("32-true", "always", model)["matmul_dtype"] == "bfloat16"
    model.set_matmul_precision(None)
    assert describe("32-true", "never", model) == {"precision": "32-true", "low_precision_matmuls": "never",
                                                   "matmul_dtype": "float32", "bf16_weights": []}
    assert describe("bf16-mixed", "auto", model)["matmul_dtype"] == "bfloat16"


@pytest.mark.parametrize("fast_bf16", [True, False])
def test_resolve(fast_bf16, monkeypatch):
    monkeypatch.setattr(precision, "has_fast_bf16", lambda device: fast_bf16)
    auto = resolve("auto", None, "cpu")
    assert (auto is not None) == fast_bf16
    if fast_bf16:
        assert auto.min_weight_elements == precision.AUTO_MIN_WEIGHT_ELEMENTS
    assert resolve("always", None, "cpu") == MatmulPrecision()
    assert resolve("never", None, "cpu") is None
    for explicit in ("32-true", "bf16-mixed"):  # Lightning's precision decides
        assert resolve("always", explicit, "cpu") is None
    with pytest.raises(ValueError, match="low_precision_matmuls"):
        resolve("sometimes", None, "cpu")


# /proc/cpuinfo flags of the two kinds of AMD EPYC this project meets (abridged).
ZEN4_FLAGS = "fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni"
AVX2_ONLY_FLAGS = "fpu sse2 avx avx2 fma bmi2"


@pytest.mark.parametrize("flags, native", [(ZEN4_FLAGS, True), (AVX2_ONLY_FLAGS, False),
                                           ("fpu avx2 amx_tile amx_bf16", True), ("avx512f avx512_vnni", False)])
def test_auto_chooses_bf16_from_the_cpu_flags(flags, native, tmp_path, monkeypatch, caplog):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n\nprocessor\t: 1\n"
                       f"flags\t\t: {flags}\n")
    assert precision.cpu_flags(str(cpuinfo)) == set(flags.split())
    monkeypatch.setattr(precision, "cpu_flags", lambda: set(flags.split()))
    monkeypatch.setattr(precision, "_warned_emulated", set())
    assert precision.has_fast_bf16("cpu") == native
    auto = resolve("auto", None, "cpu")
    assert auto == (MatmulPrecision(min_weight_elements=precision.AUTO_MIN_WEIGHT_ELEMENTS) if native else None)
    with caplog.at_level("WARNING", logger=precision.__name__):
        for _ in range(3):
            assert resolve("always", None, "cpu") == MatmulPrecision()  # always is always bf16 ...
    emulated = [r for r in caplog.records if "emulated" in r.getMessage()]
    assert len(emulated) == (0 if native else 1)  # ... and says once where it is emulated
    if not native:
        assert "neither avx512_bf16 nor amx_bf16" in emulated[0].getMessage()


def test_without_cpu_flags_torchs_own_probes_decide(tmp_path, monkeypatch):
    """No /proc/cpuinfo (macOS, Windows): no flags, and torch's probes of AVX-512 BF16 and AMX answer; a device
    neither CPU nor CUDA (mps) has no fast bf16 here."""
    assert precision.cpu_flags(str(tmp_path / "no_cpuinfo")) == set()
    monkeypatch.setattr(precision, "cpu_flags", lambda: set())
    for avx512_bf16, amx, native in ((False, False, False), (False, True, True), (True, False, True)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
        assert precision.has_fast_bf16("cpu") == native
    assert not precision.has_fast_bf16("mps")


def test_the_flags_of_this_machine_are_read():
    """cpu_flags reads the real /proc/cpuinfo where there is one (the choice above then follows it)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next(line for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags on this system")
    assert precision.cpu_flags() == set(line.split(":", 1)[1].split())


class CountCasts(TorchDispatchMode):
    """Counts the dtype conversions of tensors of given shapes."""

    def __init__(self, shapes):
        super().__init__()
        self.shapes, self.count = {tuple(s) for s in shapes}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._to_copy.default,) and tuple(args[0].shape) in self.shapes:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
def test_weights_cast_once_per_sequence(cell):
    layer = CELLS[cell](8, 16, "fast")
    layer.matmul_precision = MatmulPrecision()
    hidden = [p for n, p in layer.named_parameters() if n.startswith("hidden_weight")]
    x = torch.randn(2, 25, 8)
    with torch.no_grad(), CountCasts([p.t().shape for p in hidden] + [p.shape for p in hidden]) as counter:
        layer(x)
    assert counter.count == len(hidden)  # once each for 25 steps


def test_trainer_precision_32_true_is_pure_float32(compose_config, tiny_corpus, tmp_path, monkeypatch):
    from robustness_helpers import train

    monkeypatch.setattr(precision, "has_fast_bf16", lambda device: True)
    common = (f"data.path={tiny_corpus}", "data.batch_size=4", "data.seq_len=16", "trainer.max_steps=2",
              "model.steps_per_epoch=2", "trainer.enable_progress_bar=false", "trainer.accelerator=cpu",
              "model=astra_beta", "evaluation.samples.chars=10")
    summary = train(compose_config(*common, "trainer.precision=32-true"))
    assert (summary["precision"], summary["matmul_dtype"], summary["bf16_weights"]) == ("32-true", "float32", [])
    cfg = compose_config(*common)  # the default: auto
    cfg.paths.output_dir = str(tmp_path / "auto")
    summary = train(cfg)
    assert summary["low_precision_matmuls"] == "auto" and summary["matmul_dtype"] == "bfloat16+float32"
    assert "layers.1.input_weight" in summary["bf16_weights"]


def test_bad_setting_is_refused(compose_config, tiny_corpus):
    from gru_experiments.errors import UserError
    from gru_experiments.runs.checks import validate

    with pytest.raises(UserError, match="low_precision_matmuls='sometimes'"):
        validate(compose_config(f"data.path={tiny_corpus}", "low_precision_matmuls=sometimes"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
def test_cuda_bf16_matches_float32_reference(cell):
    """The same code path on a GPU (cuBLAS bf16), held to float32 within BF16_RTOL."""
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # a true float32 reference
    try:
        compare_layer(cell, "cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32


def test_always_on_a_family_without_bf16_matmuls_says_so_in_one_line(caplog):
    """The protocol's optional set_matmul_precision does nothing by default: `always` cannot apply, and says so."""
    trainer = SimpleNamespace(precision="32-true", strategy=SimpleNamespace(root_device=torch.device("cpu")))
    mlp = BengioMLP(11, context=4, embedding_dim=4, hidden_size=8)
    with caplog.at_level("WARNING", logger="gru_experiments.models.precision"):
        record = precision.apply_matmul_precision(mlp, "always", None, trainer)
    said = [r.getMessage() for r in caplog.records if "has no bf16 matmuls" in r.getMessage()]
    assert len(said) == 1 and "BengioMLP (mlp)" in said[0] and "\n" not in said[0]
    assert record["matmul_dtype"] == "float32" and record["bf16_weights"] == []
    caplog.clear()
    with caplog.at_level("WARNING", logger="gru_experiments.models.precision"):
        precision.apply_matmul_precision(RecurrentLM(11, "gru", 4, 8), "always", None, trainer)
    assert not any("has no bf16 matmuls" in r.getMessage() for r in caplog.records)
