"""The fast recurrence computes exactly the study's formulation: the readable reference
(`implementation="reference"`, a loop over `step`) within 1e-5 in float32 — outputs, final
state, every parameter's gradient, the input's and the initial state's gradients — for
GRU, LSTM and Elman RNN, one layer and stacked in RecurrentLM, with and without an initial state."""

from __future__ import annotations

import pytest
import torch

import gru_experiments.models.fast_recurrence as fast_recurrence
from gru_experiments.models.cells import GRULayer, LSTMLayer, RNNLayer
from gru_experiments.models.recurrent import RecurrentLM

CELLS = {"gru": GRULayer, "lstm": LSTMLayer, "rnn": RNNLayer}
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def flatten_state(state):
    if isinstance(state, torch.Tensor):
        return [state]
    return [t for s in state for t in flatten_state(s)]


def weighted_loss(tensors, seed=123):
    """A loss that weighs every element differently, so that each output and each state
    element gets its own gradient (a plain .sum() would hide sign/permutation errors)."""
    g = torch.Generator().manual_seed(seed)
    return sum((t * torch.randn(t.shape, generator=g, dtype=t.dtype)).sum() for t in tensors)


def pair(cell, input_size, hidden_size, dtype):
    torch.manual_seed(0)
    reference = CELLS[cell](input_size, hidden_size, "reference").to(dtype)
    fast = CELLS[cell](input_size, hidden_size, "fast").to(dtype)
    fast.load_state_dict(reference.state_dict())
    return reference, fast


def make_state(cell, batch, hidden, dtype):
    h = torch.randn(batch, hidden, dtype=dtype, requires_grad=True)
    if cell != "lstm":
        return h
    return h, torch.randn(batch, hidden, dtype=dtype, requires_grad=True)


def run(layer, x, state):
    y, final = layer(x, state)
    return [y, *flatten_state(final)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
def test_layer_matches_reference(cell, with_state, dtype):
    reference, fast = pair(cell, 5, 6, dtype)
    torch.manual_seed(1)
    x = torch.randn(3, 9, 5, dtype=dtype, requires_grad=True)
    state = make_state(cell, 3, 6, dtype) if with_state else None
    inputs = [x, *(flatten_state(state) if with_state else []), *reference.parameters()]
    fast_inputs = [x, *(flatten_state(state) if with_state else []), *fast.parameters()]

    ref_out = run(reference, x, state)
    fast_out = run(fast, x, state)
    for a, b in zip(fast_out, ref_out, strict=True):
        torch.testing.assert_close(a, b, **TOL[dtype])
    ref_grads = torch.autograd.grad(weighted_loss(ref_out), inputs)
    fast_grads = torch.autograd.grad(weighted_loss(fast_out), fast_inputs)
    for a, b in zip(fast_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
def test_longer_sequence_float32(cell):
    """64 steps, batch 8, hidden 32: gradients accumulated over many steps stay within 1e-5."""
    reference, fast = pair(cell, 16, 32, torch.float32)
    torch.manual_seed(2)
    x = torch.randn(8, 64, 16, requires_grad=True)
    state = make_state(cell, 8, 32, torch.float32)
    results = []
    for layer in (reference, fast):
        out = run(layer, x, state)
        loss = weighted_loss(out) / 100
        results.append((out, torch.autograd.grad(loss, [x, *flatten_state(state), *layer.parameters()])))
    for a, b in zip(results[1][0] + list(results[1][1]), results[0][0] + list(results[0][1]), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("cell,layer_norm", [("gru", False), ("lstm", True), ("rnn", False)])
def test_stacked_model_matches_reference(cell, layer_norm, with_state):
    torch.manual_seed(0)
    kwargs = dict(vocab_size=11, cell=cell, embedding_dim=6, hidden_size=8, num_layers=3, dropout=0.0,
                  layer_norm=layer_norm)
    reference = RecurrentLM(**kwargs, implementation="reference")
    fast = RecurrentLM(**kwargs, implementation="fast")
    fast.load_state_dict(reference.state_dict())
    tokens = torch.randint(0, 11, (4, 10))
    state = None
    if with_state:
        state = [make_state(cell, 4, 8, torch.float32) for _ in range(3)]
    state_leaves = flatten_state(state) if with_state else []

    outs, grads = [], []
    for model in (reference, fast):
        logits, final = model(tokens, state)
        out = [logits, *flatten_state(final)]
        outs.append(out)
        grads.append(torch.autograd.grad(weighted_loss(out), [*state_leaves, *model.parameters()]))
    for a, b in zip(outs[1], outs[0], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    names = [f"state{i}" for i in range(len(state_leaves))] + [n for n, _ in reference.named_parameters()]
    for name, a, b in zip(names, grads[1], grads[0], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def grad_fn_names(tensor) -> set[str]:
    seen, stack, names = set(), [tensor.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(type(fn).__name__)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return names


@pytest.mark.parametrize("cell,function", [("gru", "_GRUFunctionBackward"), ("lstm", "_LSTMFunctionBackward"),
                                           ("rnn", "_RNNFunctionBackward")])
def test_training_uses_the_fast_path_by_default(cell, function, monkeypatch):
    calls = []
    layer_class = CELLS[cell]
    original = layer_class.fast_sequence
    monkeypatch.setattr(layer_class, "fast_sequence", lambda *a: calls.append(1) or original(*a))
    model = RecurrentLM(7, cell, 4, 5, num_layers=2)  # no implementation argument: the default
    assert all(layer.implementation == "fast" for layer in model.layers)
    logits, _ = model(torch.randint(0, 7, (2, 6)))
    assert len(calls) == 2  # once per layer, not once per step
    names = grad_fn_names(logits)
    assert function in names  # the hand-written backward, not per-step autograd
    assert "SigmoidBackward0" not in names and "TanhBackward0" not in names

    reference = RecurrentLM(7, cell, 4, 5, num_layers=2, implementation="reference")
    calls.clear()
    assert function not in grad_fn_names(reference(torch.randint(0, 7, (2, 6)))[0])
    assert calls == []


@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
def test_gradcheck_float64(cell):
    """Finite differences on the fast layer: input, initial state and every parameter at once."""
    torch.manual_seed(0)
    layer = CELLS[cell](3, 4, "fast").double()
    names = [n for n, _ in layer.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in layer.parameters()]
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    leaves = flatten_state(make_state(cell, 2, 4, torch.float64))
    n_state = len(leaves)

    def f(x, *rest):
        state = rest[0] if cell != "lstm" else tuple(rest[:n_state])
        y, final = torch.func.functional_call(layer, dict(zip(names, rest[n_state:])), (x, state))
        return (y, *flatten_state(final))

    assert torch.autograd.gradcheck(f, (x, *leaves, *params))


@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
def test_no_grad_path_and_stateful_continuation(cell):
    """Sampling runs without autograd: same numbers as the training path; and feeding one
    token at a time with the carried state reproduces the whole-sequence logits."""
    torch.manual_seed(0)
    model = RecurrentLM(13, cell, 6, 8, num_layers=2, dropout=0.0).eval()
    tokens = torch.randint(0, 13, (3, 12))
    with_grad, state_grad = model(tokens)
    with torch.no_grad():
        without, state_nograd = model(tokens)
        state, pieces = None, []
        for t in range(tokens.shape[1]):
            logits, state = model(tokens[:, t: t + 1], state)
            pieces.append(logits)
    assert with_grad.grad_fn is not None and without.grad_fn is None
    torch.testing.assert_close(without, with_grad.detach())
    torch.testing.assert_close(torch.cat(pieces, 1), with_grad.detach(), atol=1e-6, rtol=1e-5)
    for a, b, c in zip(flatten_state(state), flatten_state(state_nograd), flatten_state(state_grad)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(b, c.detach())


@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
def test_odd_inputs(cell):
    """Batch 1, one time step, a non-contiguous input, and a frozen (no-grad) layer."""
    reference, fast = pair(cell, 4, 5, torch.float32)
    x_wide = torch.randn(6, 1, 8)[..., ::2]  # non-contiguous (1, ... ) slices below
    for x in (torch.randn(1, 1, 4), torch.randn(1, 7, 4), x_wide.transpose(0, 1)):
        x = x.requires_grad_()
        a, b = run(fast, x, None), run(reference, x, None)
        for u, v in zip(a, b, strict=True):
            torch.testing.assert_close(u, v, atol=1e-5, rtol=1e-5)
        ga = torch.autograd.grad(weighted_loss(a), x)[0]
        gb = torch.autograd.grad(weighted_loss(b), x)[0]
        torch.testing.assert_close(ga, gb, atol=1e-5, rtol=1e-5)
    for p in fast.parameters():
        p.requires_grad_(False)
    x = torch.randn(2, 3, 4, requires_grad=True)  # only the input needs a gradient
    torch.autograd.grad(weighted_loss(run(fast, x, None)), x)


@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
def test_autocast_bfloat16_runs(cell):
    torch.manual_seed(0)
    model = RecurrentLM(9, cell, 8, 16, num_layers=2, dropout=0.0)
    tokens = torch.randint(0, 9, (2, 5))
    full, _ = model(tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, state = model(tokens)
        loss = logits.float().logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and p.grad.isfinite().all()
               for p in model.parameters())
    torch.testing.assert_close(logits.float(), full.detach(), atol=0.1, rtol=0.05)


@pytest.mark.skipif(not fast_recurrence.common.HAS_MKL_PACKED, reason="this torch build has no MKL packed GEMM")
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
def test_packed_weight_path_matches_reference(cell, with_state, monkeypatch):
    """Big layers use MKL's packed GEMM for the per-step matmuls; force it at a small shape."""
    monkeypatch.setattr(fast_recurrence.common, "PACKED_MIN_WEIGHT_ELEMENTS", 0)
    monkeypatch.setattr(fast_recurrence.common, "PACKED_MIN_STEPS", 1)
    assert fast_recurrence.common.StepMatmul(torch.randn(6, 18), 3, 9).packed is not None
    test_layer_matches_reference(cell, with_state, torch.float32)
    # float64 cannot be packed: it falls back to plain matmuls on its own
    assert fast_recurrence.common.StepMatmul(torch.randn(6, 18, dtype=torch.float64), 3, 9).packed is None
    test_layer_matches_reference(cell, with_state, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
def test_single_step_without_grad_matches_reference(cell, dtype):
    """The one-token sampling shortcut (T == 1, no grad) against the reference, with and without a state."""
    reference, fast = pair(cell, 5, 6, dtype)
    x = torch.randn(4, 1, 5, dtype=dtype)
    with torch.no_grad():
        for state in (None, make_state(cell, 4, 6, dtype)):
            for a, b in zip(run(fast, x, state), run(reference, x, state), strict=True):
                torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
def test_cuda_matches_reference(cell):
    """The fast path is device-agnostic torch code: the same exactness on a GPU (float64, so
    that TF32 or reduced-precision matmul settings cannot blur the comparison), plus autocast."""
    reference, fast = (m.cuda() for m in pair(cell, 5, 6, torch.float64))
    x = torch.randn(3, 9, 5, dtype=torch.float64, device="cuda", requires_grad=True)
    state = make_state(cell, 3, 6, torch.float64)
    state = state.detach().cuda().requires_grad_() if cell != "lstm" else tuple(
        s.detach().cuda().requires_grad_() for s in state)
    leaves = flatten_state(state)
    outs = [run(m, x, state) for m in (reference, fast)]
    grads = [torch.autograd.grad(weighted_loss([o.cpu() for o in out]), [x, *leaves, *m.parameters()])
             for out, m in zip(outs, (reference, fast))]
    for a, b in zip(outs[1] + list(grads[1]), outs[0] + list(grads[0]), strict=True):
        torch.testing.assert_close(a, b, **TOL[torch.float64])
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y, _ = fast.float()(x.float())
    y.float().sum().backward()


def test_a_cell_without_a_fast_path_runs_its_readable_step(monkeypatch):
    """A new cell need not come with a fast path: implementation="fast" then runs `step`."""
    torch.manual_seed(0)
    reference = RecurrentLM(7, "rnn", 4, 5, num_layers=2, implementation="reference")
    monkeypatch.setattr(RNNLayer, "fast_sequence", None)
    fast = RecurrentLM(7, "rnn", 4, 5, num_layers=2, implementation="fast")
    fast.load_state_dict(reference.state_dict())
    tokens = torch.randint(0, 7, (2, 6))
    torch.testing.assert_close(fast.eval()(tokens)[0], reference.eval()(tokens)[0])
