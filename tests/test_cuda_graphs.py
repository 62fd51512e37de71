"""cuda_graphs: the training step and the inference forwards replayed from CUDA graphs equal the eager ones
(models/cuda_graphs.py).

The GPU tests run where CUDA is and skip with their reason elsewhere; the CPU tests check that on a CPU the step
object is the plain eager step, writing (not adding) its gradients, and that inference calls the model itself."""

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gru_experiments.models.cuda_graphs import (
    GraphedForward,
    GraphedTrainingStep,
    cuda_graphs,
    graphed,
    weight_addresses,
)
from gru_experiments.models.precision import resolve
from gru_experiments.models.protocol import copy_state, map_state
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.study.cache import stateful_states
from gru_experiments.study.generation import sample_tokens
from gru_experiments.study.scores import Split, score_stateful, score_windowed

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: CUDA graphs need one")


def loss_of(model):
    def loss_fn(inputs, targets, state=None):
        logits, state = model(inputs, state)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)), state
    return loss_fn


def batches(vocab, steps, device, batch=16, seq_len=32, seed=0):
    """Random windows of one fixed random text of 300 tokens: something to learn within 50 steps."""
    generator = torch.Generator().manual_seed(seed)
    text = torch.randint(vocab, (300,), generator=generator)
    starts = torch.randint(300 - seq_len - 1, (steps, batch, 1), generator=generator)
    tokens = text[starts + torch.arange(seq_len + 1)]
    return [(t[:, :-1].to(device), t[:, 1:].to(device)) for t in tokens]


def train(model, data, graphed: bool):
    """AdamW and clipping at 1.0 as the project's recipe: the losses of every step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = GraphedTrainingStep(loss_of(model), model.parameters(), say=lambda line: None) if graphed else None
    losses = []
    for inputs, targets in data:
        if step is not None:
            loss, _ = step(inputs, targets)
            assert all(p.grad is not None for p in model.parameters())
        else:
            optimizer.zero_grad(set_to_none=True)
            loss, _ = loss_of(model)(inputs, targets)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if len(losses) % 10 == 0:  # as Lightning before each validation: the gradients let go (set to None)
            optimizer.zero_grad(set_to_none=True)
    return losses, step


def test_on_the_cpu_the_step_is_eager_and_writes_its_gradients():
    torch.manual_seed(0)
    model = RecurrentLM(11, "gru", 8, 16, num_layers=2, dropout=0.0)
    step = GraphedTrainingStep(loss_of(model), model.parameters(), warmup=0)
    inputs, targets = batches(11, 1, "cpu")[0]
    first, _ = step(inputs, targets)
    grads = [p.grad.clone() for p in model.parameters()]
    again, _ = step(inputs, targets)  # the same batch: the same gradients, not twice them
    assert not step.captured and step.failed is None
    assert float(first) == float(again)
    for p, g in zip(model.parameters(), grads):
        assert torch.equal(p.grad, g)
    expected, _ = loss_of(model)(inputs, targets)
    assert float(expected.detach()) == float(first)
    assert graphed(model) is model  # inference on a CPU: the model itself


@CUDA
@pytest.mark.parametrize("cell, layer_norm, low_precision", [("gru", False, "never"), ("gru", False, "always"),
                                                             ("lstm", True, "always")])
def test_graphed_training_equals_eager_over_50_steps(cell, layer_norm, low_precision):
    """Same seed, same batches, dropout on: the graphed step's losses and weights follow the eager ones."""
    torch.manual_seed(0)
    eager = RecurrentLM(65, cell, 32, 64, num_layers=2, dropout=0.1, layer_norm=layer_norm).cuda()
    graphed = copy.deepcopy(eager)
    for model in (eager, graphed):
        model.set_matmul_precision(resolve(low_precision, None, torch.device("cuda")))
    data = batches(65, 50, "cuda")
    torch.cuda.manual_seed(1)
    eager_losses, _ = train(eager, data, graphed=False)
    torch.cuda.manual_seed(1)
    graphed_losses, step = train(graphed, data, graphed=True)
    assert step.captured, step.failed
    tolerance = dict(rtol=1e-3, atol=1e-4) if low_precision == "never" else dict(rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(torch.tensor(graphed_losses), torch.tensor(eager_losses), **tolerance)
    for (name, a), b in zip(graphed.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, **tolerance, msg=lambda m, name=name: f"{name}: {m}")
    assert graphed_losses[-1] < graphed_losses[0] - 0.5  # it trained


@CUDA
def test_a_step_that_cannot_be_captured_trains_eagerly_and_says_so():
    """Dropout on: after the broken-off capture the eager steps still draw from the CUDA generator."""
    torch.manual_seed(0)
    model = RecurrentLM(11, "gru", 8, 16, dropout=0.1).cuda()
    said = []

    def syncing_loss(inputs, targets, state=None):  # .item() syncs with the host: forbidden inside a capture
        loss, state = loss_of(model)(inputs, targets, state)
        float(loss.item())
        return loss, state
    step = GraphedTrainingStep(syncing_loss, model.parameters(), warmup=1, say=said.append)
    for inputs, targets in batches(11, 4, "cuda"):
        loss, _ = step(inputs, targets)
        assert all(p.grad is not None for p in model.parameters())
    assert not step.captured and step.failed
    assert len(said) == 1 and said[0].startswith("cuda_graphs: the training step could not be captured")
    assert torch.isfinite(loss)
    torch.nn.functional.dropout(torch.ones(8, device="cuda"), 0.5)  # the generator works outside a capture


@CUDA
def test_carried_state_steps_equal_eager():
    """training=streams: the step from a carried state (its own graph beside the zero state's) equals eager."""
    torch.manual_seed(0)
    eager = RecurrentLM(65, "lstm", 16, 32, num_layers=2, dropout=0.0).cuda()
    graphed_model = copy.deepcopy(eager)
    step = GraphedTrainingStep(loss_of(graphed_model), graphed_model.parameters(), warmup=1, say=lambda line: None)
    state_eager = state_graphed = None
    for i, (inputs, targets) in enumerate(batches(65, 8, "cuda")):
        if i % 4 == 0:
            state_eager = state_graphed = None  # a pass starts: the zero state
        eager.zero_grad(set_to_none=True)
        loss, state_eager = loss_of(eager)(inputs, targets, state_eager)
        loss.backward()
        state_eager = [tuple(t.detach() for t in s) for s in state_eager]
        graphed_loss, state_graphed = step(inputs, targets, state_graphed)
        torch.testing.assert_close(graphed_loss, loss.detach())
        for a, b in zip(graphed_model.parameters(), eager.parameters()):
            torch.testing.assert_close(a.grad, b.grad)
    assert len(step.graphs) == 2  # from the zero state, from a carried one


@CUDA
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_inference_graphs_give_the_eager_figures_and_samples(cell):
    torch.manual_seed(0)
    model = RecurrentLM(65, cell, 16, 32, num_layers=2, dropout=0.1).cuda()
    split = Split(torch.randint(65, (5000,), device="cuda"), torch.ones(65, dtype=torch.long, device="cuda"), None)
    prompt = torch.randint(65, (4, 5), device="cuda")

    def figures(enabled):
        with cuda_graphs(enabled):
            stateful = score_stateful(model, split, 64, 8)
            kept = stateful_states(model, split, 64, 8)  # the cache's pass: replayed too (forward_features)
            windowed = score_windowed(model, split, 32)
            tokens = sample_tokens(model, prompt, 40, "stateful", lambda logits: logits.argmax(-1))
        return stateful, windowed, tokens, kept

    eager, replayed = figures(False), figures(True)
    torch.testing.assert_close(replayed[3][1].hidden, eager[3][1].hidden, rtol=0, atol=0)
    torch.testing.assert_close(replayed[3][0].nll, eager[3][0].nll, rtol=0, atol=0)
    assert any(key[0] == "forward_features" for key in graphed(model).graphs)
    assert graphed(model).graphs  # the graphed run replayed some shapes
    torch.testing.assert_close(replayed[0].nll, eager[0].nll, rtol=1e-6, atol=0)
    torch.testing.assert_close(replayed[1].nll, eager[1].nll, rtol=1e-6, atol=0)
    assert torch.equal(replayed[2], eager[2])


def test_graphs_are_forgotten_when_any_weight_moved():
    """A parameter placed elsewhere (not the first one, as after .cpu() and .cuda()) makes the next pass forget
    the graphs captured before: they read the old memory."""
    model = RecurrentLM(65, "gru", 16, 32, num_layers=2, layer_norm=True)
    before = weight_addresses(model)
    assert len(before) == len(list(model.parameters())) + len(list(model.buffers()))
    forward = GraphedForward(model).refresh()
    forward.graphs, forward.seen = {"a shape": "its graph"}, {"a shape"}
    assert forward.refresh().graphs  # nothing moved: kept
    model.head.weight.data = model.head.weight.data.clone()
    assert weight_addresses(model) != before and weight_addresses(model)[0] == before[0]
    assert not forward.refresh().graphs and not forward.seen


@CUDA
def test_a_model_whose_weights_moved_is_captured_again():
    """Lightning's teardown moves the model to the CPU and the evaluation moves it back: graphs captured before
    read the old memory and must not be replayed."""
    torch.manual_seed(0)
    model = RecurrentLM(65, "gru", 16, 32, num_layers=2).cuda()
    split = Split(torch.randint(65, (3000,), device="cuda"), torch.ones(65, dtype=torch.long, device="cuda"), None)
    with cuda_graphs(True):
        score_stateful(model, split, 64, 8)  # captured here
        old = model.head.weight.data  # kept alive: a stale replay reads it, the old figures, not freed memory
        model.head.weight.data = old * 2.0  # elsewhere now, as a move can leave any parameter but the first
        replayed = score_stateful(model, split, 64, 8)
    with cuda_graphs(False):
        eager = score_stateful(model, split, 64, 8)
    assert replayed.nll == pytest.approx(eager.nll, rel=1e-6)


@CUDA
def test_a_model_let_go_takes_its_graphs_with_it():
    import gc
    import weakref
    model = RecurrentLM(65, "gru", 16, 32).cuda()
    graphed(model)
    let_go = weakref.ref(model)
    del model
    gc.collect()
    assert let_go() is None


class EmulatedGraph:
    """A CPU stand-in for a captured CUDA graph, as the hardware behaves: capture runs nothing but leaves the
    outputs' and the gradients' memory; each replay runs the function on the static inputs and writes its
    outputs and gradients into that memory, and leaves every parameter's .grad attribute as it finds it."""

    def __init__(self, fn, inputs, parameters):
        self.fn, self.inputs, self.parameters = fn, inputs, parameters
        rng = torch.get_rng_state()
        self.outputs = fn(*inputs)  # only to have the outputs' memory; a capture runs nothing, draws nothing
        torch.set_rng_state(rng)
        self.memory = [p.grad for p in parameters]
        self.grads: list = []
        self.replays = 0

    def replay(self, *inputs):
        self.replays += 1
        for static, value in zip(self.inputs, inputs):
            copy_state(static, value)
        attached = [p.grad for p in self.parameters]
        for p in self.parameters:
            p.grad = None
        outputs = self.fn(*self.inputs)
        for memory, p, kept in zip(self.memory, self.parameters, attached):
            memory.copy_(p.grad)
            p.grad = kept
        copy_state(self.outputs, outputs)
        return self.outputs


@pytest.mark.slow  # more than ~3 s on the 2-core CPU (pyproject's marker)
def test_the_cache_reads_a_replayed_stateful_pass(monkeypatch):
    """The cache reads the final hidden states the protocol's forward_features returns (no hook): a final
    evaluation's stateful pass, the cache's, replays graphs as every other pass (the capture emulated on the CPU),
    and every figure, the cache's included, is the eager one."""
    from evaluation_helpers import request_of

    from gru_experiments.models import cuda_graphs as graphs
    from gru_experiments.study.evaluation import evaluate

    torch.manual_seed(0)
    model = RecurrentLM(11, "gru", 8, 16, num_layers=2, layer_norm=True).eval()
    ids = torch.randint(11, (3000,), generator=torch.Generator().manual_seed(1))
    request = request_of(model, Split(ids, torch.ones(11, dtype=torch.long)), 16, {"streams": 4},
                         train_ids=ids.flip(0))
    with cuda_graphs(False):
        eager = evaluate(request).summary()
    captured = []

    def capture(fn, *inputs):
        captured.append(EmulatedGraph(fn, map_state(torch.Tensor.clone, inputs), []))
        return captured[-1]
    with monkeypatch.context() as patch, cuda_graphs(True):
        patch.setattr(graphs.GraphedForward, "capturable", staticmethod(lambda tokens: True))
        patch.setattr(graphs, "capture", capture)
        replayed = evaluate(request).summary()
    cache_pass = [graph for graph in captured if graph.fn == model.forward_features]
    assert cache_pass and all(graph.replays for graph in cache_pass)  # its chunks replayed: no eager fallback
    assert replayed["cache"]["kind"] == "continuous" and replayed == eager



def emulate_capture(monkeypatch, graphs, captured: list) -> None:
    """GraphedTrainingStep captures on the CPU, each capture an EmulatedGraph (appended to `captured`)."""
    monkeypatch.setattr(graphs.GraphedTrainingStep, "capturable", staticmethod(lambda inputs: True))

    def capture(fn, *inputs):
        step = fn.__self__  # the step's bound _forward_backward: its parameters are the graph's
        captured.append(EmulatedGraph(fn, map_state(torch.Tensor.clone, inputs), step.parameters))
        return captured[-1]
    monkeypatch.setattr(graphs, "capture", capture)


def test_a_training_step_replayed_from_an_emulated_capture_equals_the_eager_step(monkeypatch):
    """After its warmup the step is captured once (saying so), then every step of that shape replays the graph: the
    eager step's loss and gradients, the gradients in the graph's memory, the loss a copy the next replay leaves."""
    from gru_experiments.models import cuda_graphs as graphs

    torch.manual_seed(0)
    model = RecurrentLM(11, "gru", 8, 16, num_layers=2, dropout=0.0)
    captured, said = [], []
    emulate_capture(monkeypatch, graphs, captured)
    step = GraphedTrainingStep(loss_of(model), model.parameters(), warmup=1, say=said.append)
    losses = []
    for i, (inputs, targets) in enumerate(batches(11, 4, "cpu")):
        loss, _ = step(inputs, targets)
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        expected, _ = loss_of(model)(inputs, targets)
        expected.backward()
        assert float(loss) == pytest.approx(float(expected.detach()), rel=1e-6), i
        for p, g in zip(model.parameters(), grads):
            torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-7)
        losses.append(loss)
    (graph,) = captured
    assert step.captured and step.failed is None and graph.replays == 3  # steps 2, 3 and 4
    assert said == ["cuda_graphs: the training step is captured at step 2 and replayed from then on"]
    assert len({float(loss) for loss in losses}) == 4  # each step's own loss, not the graph's last output
    assert not any(p.grad is g for p, g in zip(step.parameters, graph.memory))  # the eager check's own gradients
    step(*batches(11, 1, "cpu", seed=1)[0])
    assert all(p.grad is g for p, g in zip(step.parameters, graph.memory))  # a replay puts the graph's back


def test_a_capture_that_breaks_off_releases_the_generators_and_leaves_every_step_eager(monkeypatch):
    """CUDA refusing the capture (a stand-in for torch.cuda.graph): the CUDA generators are handed a copy of their
    state (they would believe they are still capturing), the step says why in one line, once, and trains eagerly;
    the inference forward says so too and evaluates eagerly from then on."""
    from gru_experiments.models import cuda_graphs as graphs

    class Generator:
        def __init__(self):
            self.set_to = []

        def clone_state(self):
            return "a copy of its state"

        def graphsafe_set_state(self, state):
            self.set_to.append(state)

    class RefusedCapture:
        def __init__(self, graph):
            pass

        def __enter__(self):
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nCUDA kernel errors...")

        def __exit__(self, *exc):
            return False

    torch.manual_seed(0)  # before the stand-in generators: where CUDA is, it seeds every CUDA generator too
    model = RecurrentLM(11, "gru", 8, 16, dropout=0.0)
    generator = Generator()
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", RefusedCapture)
    monkeypatch.setattr(torch.cuda, "default_generators", (generator,))
    monkeypatch.setattr(graphs.GraphedTrainingStep, "capturable", staticmethod(lambda inputs: True))
    said = []
    step = GraphedTrainingStep(loss_of(model), model.parameters(), warmup=0, say=said.append)
    for inputs, targets in batches(11, 3, "cpu"):
        loss, _ = step(inputs, targets)
        expected, _ = loss_of(model)(inputs, targets)
        assert float(loss) == float(expected.detach()) and all(p.grad is not None for p in model.parameters())
    refused = "RuntimeError: CUDA error: operation not permitted when stream is capturing"
    assert not step.captured and step.failed == refused and generator.set_to == ["a copy of its state"]
    assert said == [f"cuda_graphs: the training step could not be captured ({refused}); training eagerly"]

    monkeypatch.setattr(graphs.GraphedForward, "capturable", staticmethod(lambda tokens: True))
    forward, tokens = graphs.GraphedForward(model.eval()).refresh(), torch.randint(11, (2, 5))
    with torch.no_grad(), cuda_graphs(True):
        eager, _ = model(tokens)
        outputs = [forward(tokens)[0] for _ in range(3)]  # seen, then the capture refused, then eager at once
    assert all(torch.equal(logits, eager) for logits in outputs)
    assert forward.failed == refused and not forward.graphs and generator.set_to == ["a copy of its state"] * 2


def test_the_training_step_is_graphed_on_one_device_and_eager_under_ddp(monkeypatch, capsys):
    """LanguageModelTask.on_train_start (the graphs' device a CPU here, as in the test below): one process builds the
    graphed step, which training_step then runs; several (DDP reduces gradients outside any graph) train eagerly,
    with a line saying why."""
    from types import SimpleNamespace

    from gru_experiments.runs import task as task_module
    from gru_experiments.runs.task import LanguageModelTask

    monkeypatch.setattr(task_module, "GRAPH_DEVICE", "cpu")
    task = LanguageModelTask({"_target_": "gru_experiments.models.recurrent.RecurrentLM", "cell": "gru",
                              "embedding_dim": 8, "hidden_size": 16, "dropout": 0.0}, 11, lr=1e-3,
                             optim={"name": "original"})
    inputs, targets = batches(11, 1, "cpu")[0]
    with cuda_graphs(True):
        task.trainer = SimpleNamespace(world_size=2)
        task.on_train_start()
        assert task.graphed_step is None
        assert capsys.readouterr().out == "cuda_graphs: not used under DDP (2 processes); training eagerly\n"
        task.trainer = SimpleNamespace(world_size=1)
        task.on_train_start()
    assert isinstance(task.graphed_step, GraphedTrainingStep) and capsys.readouterr().out == ""
    logged = {}
    monkeypatch.setattr(task, "log", lambda name, value, **kwargs: logged.update({name: value}), raising=False)
    monkeypatch.setattr(task, "optimizers", lambda: SimpleNamespace(param_groups=[{"lr": 1e-3}]), raising=False)
    task.on_train_batch_start((inputs, targets), 0)
    loss = task.training_step((inputs, targets), 0)
    assert task.graphed_step.steps == 1 and all(p.grad is not None for p in task.parameters())  # its backward ran
    expected, _ = task.training_loss(inputs, targets)
    assert float(loss) == pytest.approx(float(expected.detach())) and logged["train/loss"] is loss
    assert task.last_epoch_train_loss == pytest.approx(float(expected.detach()))

@pytest.mark.parametrize("training", ["windows", "streams"])
@pytest.mark.slow
def test_graphed_training_through_lightning_equals_eager_across_validations(training, compose_config, tiny_corpus,
                                                                             tmp_path, monkeypatch):
    """The whole run, validations between the steps (Lightning lets .grad go before each), on the CPU with the
    capture emulated: the same weights, losses and validations as the eager run, every validation its own."""
    from robustness_helpers import train

    from gru_experiments.models import cuda_graphs as graphs
    from gru_experiments.runs import task as task_module

    def run(emulated: bool, key: bool = True):
        cfg = compose_config(f"data.path={tiny_corpus}", "preset=smoke", "model.epochs=4", "logger=csv",
                             "evaluation.text.samples=0", "trainer.accelerator=cpu", f"training={training}",
                             f"cuda_graphs={str(key).lower()}",
                             f"paths.output_dir={tmp_path / ('graphed' if emulated else 'eager') / str(key)}")
        with monkeypatch.context() as patch:
            if emulated:
                made = []
                patch.setattr(task_module, "GRAPH_DEVICE", "cpu")
                patch.setattr(graphs.GraphedTrainingStep, "capturable", staticmethod(lambda inputs: True))

                def capture(fn, *inputs):
                    step = next(s for s in made)
                    return EmulatedGraph(fn, map_state(torch.Tensor.clone, inputs), step.parameters)
                patch.setattr(graphs, "capture", capture)
                original = graphs.GraphedTrainingStep.__init__

                def init(self, *args, **kwargs):
                    original(self, *args, **kwargs)
                    made.append(self)
                patch.setattr(graphs.GraphedTrainingStep, "__init__", init)
            summary = train(cfg)
            if emulated and key:
                assert made and made[0].captured and made[0].steps == 20 and summary["cuda_graphs"]
            elif emulated:  # cuda_graphs=false: no graphed step at all
                assert not made and not summary["cuda_graphs"]
        history = Path(summary["run_dir"], "history.csv").read_text().splitlines()
        return summary, [line for line in history if ",val/loss," in line]

    eager, eager_vals = run(False)
    graphed, graphed_vals = run(True)
    assert len(eager_vals) == 4 and len(set(v.split(",")[-1] for v in eager_vals)) == 4  # it kept learning
    assert graphed_vals == eager_vals
    assert graphed["train_loss"] == pytest.approx(eager["train_loss"], rel=1e-6)
    assert graphed["stateful_bpc"] == pytest.approx(eager["stateful_bpc"], rel=1e-6)
    if training == "windows":
        run(True, key=False)
