"""minGRU and minLSTM (models/minrnn.py): the parallel scan is the step-by-step recurrence, in outputs,
carried state and gradients; an independent implementation agrees; a stateful step does the same work at
token 10,000 as at token 1. (The end-to-end runs: tests/test_families.py and tests/test_configs.py.)"""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from gru_experiments.models import minrnn
from gru_experiments.models.minrnn import MinRNNLayer, MinRNNLM, g
from gru_experiments.study.generation import Decoding, make_chooser, sample_tokens

CELLS = ["mingru", "minlstm"]
V = 11


def layer(cell: str, input_size: int = 6, hidden_size: int = 8, dtype=torch.float32, seed: int = 0) -> MinRNNLayer:
    torch.manual_seed(seed)
    made = MinRNNLayer(cell, input_size, hidden_size).to(dtype)
    with torch.no_grad():  # gates and candidates over a wide range, both branches of g included
        made.linear.weight.mul_(4)
    return made


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_the_scan_is_the_recurrence_over_128_steps_and_across_a_carried_state(cell, dtype, tolerance):
    """128 steps (four scan chunks) from a non-zero h_0 of either sign; then the same in two calls, the state
    carried (the second one ending mid-chunk), against one pass over the whole."""
    cell_layer = layer(cell, dtype=dtype)
    x, h0 = torch.randn(4, 128, 6, dtype=dtype), torch.randn(4, 8, dtype=dtype)
    with torch.no_grad():
        expected, expected_h = cell_layer.sequential(x, h0)
        scanned, h = cell_layer.scan(x, h0)
        first, carried = cell_layer(x[:, :37], h0)
        second, last = cell_layer(x[:, 37:], carried)
    close = dict(atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(scanned, expected, **close)
    torch.testing.assert_close(h, expected_h, **close)
    torch.testing.assert_close(torch.cat([first, second], 1), expected, **close)
    torch.testing.assert_close(last, expected_h, **close)


@pytest.mark.parametrize("cell", CELLS)
def test_the_model_continues_a_sequence_token_by_token(cell):
    """The whole model: one pass, a prefix then one token a call (the step), and two chunks, all agree."""
    torch.manual_seed(0)
    model = MinRNNLM(V, cell, embedding_dim=5, hidden_size=8, num_layers=3, dropout=0.3).eval()
    tokens = torch.randint(V, (2, 40))
    with torch.no_grad():
        whole, whole_state = model(tokens)
        pieces, state = [model(tokens[:, :9])[0]], model(tokens[:, :9])[1]
        for t in range(9, 40):
            logits, state = model(tokens[:, t:t + 1], state)
            pieces.append(logits)
    torch.testing.assert_close(torch.cat(pieces, 1), whole, atol=1e-5, rtol=1e-5)
    for ours, reference in zip(state, whole_state):
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)
    assert model.context is None and model.family == cell and len(state) == 3


@pytest.mark.parametrize("cell", CELLS)
def test_the_scans_gradients_are_the_recurrences(cell):
    """Every parameter's gradient, and the input's and h_0's, through the scan and through the loop (float64),
    and through the whole model (float32, every parameter)."""
    cell_layer = layer(cell, dtype=torch.float64)
    grads = []
    for run in (cell_layer.scan, cell_layer.sequential):
        x = torch.randn(3, 100, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
        h0 = torch.randn(3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).requires_grad_()
        outputs, h = run(x, h0)
        weights = torch.linspace(-1, 1, outputs.numel(), dtype=torch.float64).view_as(outputs)
        ((outputs * weights).sum() + h.square().sum()).backward()
        grads.append([x.grad, h0.grad] + [p.grad.clone() for p in cell_layer.parameters()])
        cell_layer.zero_grad()
    for ours, reference in zip(*grads):
        torch.testing.assert_close(ours, reference, atol=1e-10, rtol=1e-10)

    torch.manual_seed(0)
    model = MinRNNLM(V, cell, embedding_dim=5, hidden_size=8, num_layers=2, dropout=0.0)
    tokens = torch.randint(V, (2, 70))
    grads = []
    for sequential in (False, True):
        if sequential:  # every layer runs its loop where it ran the scan
            for each in model.layers:
                each.scan = each.sequential
        torch.nn.functional.cross_entropy(model(tokens)[0].flatten(0, 1), tokens.flatten()).backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
        model.zero_grad()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("cell", CELLS)
def test_gradcheck_of_the_scan(cell, monkeypatch):
    """torch.autograd.gradcheck (float64) of the scan in x, h_0 and the weights, over three chunks."""
    monkeypatch.setattr(minrnn, "SCAN_CHUNK", 2)
    cell_layer = layer(cell, input_size=3, hidden_size=4, dtype=torch.float64)
    names = [name for name, _ in cell_layer.named_parameters()]

    def scan(x, h0, *parameters):
        outputs, h = functional_call(cell_layer, dict(zip(names, parameters)), (x, h0))
        return outputs, h

    inputs = (torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True),
              torch.randn(2, 4, dtype=torch.float64, requires_grad=True),
              *(p.detach().clone().requires_grad_() for p in cell_layer.parameters()))
    assert torch.autograd.gradcheck(scan, inputs)


@pytest.mark.parametrize("cell", CELLS)
def test_the_first_layer_of_another_width_has_no_residual(cell):
    """embedding_dim != hidden_size: the first layer's output replaces x; later layers add to it."""
    torch.manual_seed(0)
    model = MinRNNLM(V, cell, embedding_dim=5, hidden_size=8, num_layers=2, dropout=0.0).eval()
    tokens = torch.randint(V, (2, 6))
    with torch.no_grad():
        x = model.embedding(tokens)
        x, _ = model.layers[0](model.norms[0](x))
        y, _ = model.layers[1](model.norms[1](x))
        expected = model.head(model.norm(x + y))
        torch.testing.assert_close(model(tokens)[0], expected)


def test_an_independent_implementation_agrees():
    """lucidrains' minGRU-pytorch (pip install minGRU-pytorch; the dev extra installs it), one layer, its
    weights copied into ours (its linear maps have no bias: ours are set to zero; its rows are packed in
    our order, [h̃ | z] and [h̃ | f | i]). Its one-token path and its scan both use g, as ours do. Where
    its formulation differs: its minGRU scan takes log h_0, so a carried state must be positive (ours
    takes any h_0); its minLSTM scan feeds log g(h_0) (as the paper's appendix code does for both cells),
    so from a carried state it is our scan from g(h_0), and not its own one-token path (nor ours)."""
    mingru_pytorch = pytest.importorskip("minGRU_pytorch", reason="minGRU-pytorch is not installed (the dev extra)")
    from minGRU_pytorch.minLSTM import minLSTM

    # float32: 64 steps, one scan in both (its one scan over 128 steps drifts past 1e-5), its own init;
    # float64: 128 steps, its weights tripled (gates and candidates over a wider range).
    for dtype, steps, scale, tolerance in ((torch.float32, 64, 1, 1e-5), (torch.float64, 128, 3, 1e-10)):
        for cell, make in (("mingru", mingru_pytorch.minGRU), ("minlstm", minLSTM)):
            torch.manual_seed(0)
            theirs, ours = make(8).to(dtype), MinRNNLayer(cell, 8, 8).to(dtype)
            with torch.no_grad():
                ours.linear.weight.copy_(next(theirs.parameters()).mul_(scale))
                ours.linear.bias.zero_()
                x, h0 = torch.randn(3, steps, 8, dtype=dtype), torch.rand(3, 8, dtype=dtype) + 0.1
                close = dict(atol=tolerance, rtol=tolerance)
                torch.testing.assert_close(theirs(x), ours.sequential(x, torch.zeros_like(h0))[0], **close)
                out = theirs(x[:, :1], h0.unsqueeze(1))  # its one-token path, from a carried state
                torch.testing.assert_close(out[:, 0], ours.step(x[:, 0], h0), **close)
                carried = g(h0) if cell == "minlstm" else h0  # its scan from a carried state
                torch.testing.assert_close(theirs(x, h0.unsqueeze(1)), ours.sequential(x, carried)[0], **close)


@pytest.mark.slow  # more than ~3 s on the 2-core CPU (pyproject's marker)
@pytest.mark.parametrize("cell", CELLS)
def test_stateful_sampling_does_the_same_work_at_every_token(cell):
    """10,000 characters sampled with the state carried: the prompt is one scan per layer, then every token
    one step per layer, on inputs and a state of the same size from the first token to the last (its cost
    does not grow with the history, as a transformer's window would)."""
    torch.manual_seed(0)
    model = MinRNNLM(V, cell, embedding_dim=4, hidden_size=6, num_layers=2)
    calls = []
    for index, each in enumerate(model.layers):
        def recorded(run, index=index, kind=""):
            def wrapper(x, h):
                calls.append((index, kind, tuple(x.shape), tuple(h.shape)))
                return run(x, h)
            return wrapper
        each.step, each.scan = recorded(each.step, kind="step"), recorded(each.scan, kind="scan")
    out = sample_tokens(model, torch.randint(V, (2, 7)), 10_000, "stateful",
                        make_chooser(Decoding(), torch.Generator().manual_seed(0)))
    assert out.shape == (2, 10_000)
    assert calls[:2] == [(0, "scan", (2, 7, 4), (2, 6)), (1, "scan", (2, 7, 6), (2, 6))]
    steps = calls[2:]
    assert len(steps) == 2 * 9_999
    assert set(steps) == {(0, "step", (2, 4), (2, 6)), (1, "step", (2, 6), (2, 6))}
