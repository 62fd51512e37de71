"""The evaluation's plan (study/plan.py): the forward tokens and targets it predicts are those the
scorers run and score, exactly; the budget decides the strides by its rule; and the study's default
keeps Astra-alpha's full recipe at the figures it has always had."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from evaluation_helpers import forward_tokens_run, plan_of, run_plan
from omegaconf import OmegaConf

from gru_experiments.data.corpus import SHIPPED_CORPUS, read_corpus, split_text
from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.models.mlp import BengioMLP
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.models.transformer import TransformerLM
from gru_experiments.study.plan import OTHER, PRIORITY, TEXT, Figure, Unit, WindowsPass, plan_evaluation
from gru_experiments.study.scores import (
    Split,
    _score_nll,
    congruent,
    score_contexts,
    score_stateful,
    score_windowed,
)
from gru_experiments.study.text_protocol import TextPass

V = 11
CONF = Path(__file__).parents[1] / "conf"


def gru():
    torch.manual_seed(0)
    return RecurrentLM(V, "gru", embedding_dim=5, hidden_size=8, num_layers=1).eval()


def transformer(block=16):
    torch.manual_seed(0)
    return TransformerLM(V, block_size=block, embedding_dim=8, num_layers=1, num_heads=2).eval()


def mlp():
    torch.manual_seed(0)
    return BengioMLP(V, context=4, embedding_dim=3, hidden_size=8).eval()


def text_pass(plan):
    """The plan's text statistics' pass, when planned."""
    return next((p for p, owner in zip(plan.passes, plan.owners) if owner == TEXT), None)


def val(n_tokens=700, seed=1):
    ids = torch.randint(V, (n_tokens,), generator=torch.Generator().manual_seed(seed))
    return ids, Split(ids, torch.arange(V) % 3 + 1)  # uneven characters per token, as subwords have


def test_congruent_counts_by_hand():
    for low, high, residue, stride in [(1, 10, 1, 3), (5, 40, -7, 4), (3, 2, 0, 1), (1, 100, 0, 7), (-5, 9, 2, 5)]:
        assert len(congruent(low, high, residue, stride)) == sum(1 for u in range(low, high + 1)
                                                            if (u - residue) % stride == 0)


@pytest.mark.parametrize("make", [gru, mlp, transformer], ids=["gru", "mlp", "transformer"])
@pytest.mark.parametrize("budget", [None, 40_000, 3_000, 10])
@pytest.mark.parametrize("window", [None, 12])
def test_the_forward_tokens_scored_are_the_plans_exactly(make, budget, window):
    """The forward tokens the passes run (counted at the model), and every figure's targets, equal the
    plan's: the plan counts the scorers' own geometry."""
    model = make()
    ids, split = val()
    settings = OmegaConf.create({"budget": None if budget is None else budget / 10_000, "window": window,
                                 "streams": 4, "curve_longest": 64})
    plan = plan_of(model, split.n_targets, 8, settings, training_tokens=10_000, train_ids=ids.flip(0))
    with forward_tokens_run(model) as counted:
        evaluation = run_plan(model, ids.flip(0), split, plan)
    # the dynamic pass prices its backward passes in forward tokens too (study/dynamic.BACKWARD_COST)
    backward = sum(getattr(p, "backward_tokens", 0) for p in plan.passes)
    assert sum(counted) + backward == plan.forward_tokens, [(f.name, f.forward_tokens) for f in plan.figures]
    for figure in plan.figures:
        if figure.name in evaluation.scores:
            assert evaluation.scores[figure.name].tokens == figure.targets, figure
        elif figure.name.startswith("curve "):
            key = str(figure.context)
            assert evaluation.curve["settings"]["targets"][key] == figure.targets, figure
            # A sampled point has a sampling error; an exact one (every target) none.
            assert (evaluation.curve["settings"]["bpc_se"][key] == 0) == (figure.targets == split.n_targets), figure
    if evaluation.gain is not None:
        assert evaluation.gain.tokens == plan.figure("state_gain").targets
    if budget is None:
        assert plan.exact and all(s.sampling_se == 0 for s in evaluation.scores.values())
    costly = sum(p.forward_tokens for p in plan.passes if p.kind == "windows" or
                 (p.kind in ("stateful", "one_pass") and model.tokens_per_prediction > 1))
    if budget is not None and budget >= 3_000:  # within the budget (a tiny one: one target a pass at the least)
        assert costly <= budget


def test_the_transformers_forward_cost_is_what_its_blocks_run():
    """forward_cost against the tokens the transformer's layers really run (counted at `hidden`), for
    calls that see all their history in one pass and calls past the block (a window per prediction)."""
    model = transformer(block=16)
    counted = []
    hidden = model.hidden
    model.hidden = lambda tokens: (counted.append(tokens.numel()), hidden(tokens))[1]
    ids, _ = val(200)
    state = None
    for start, new in [(0, 10), (10, 6), (16, 9), (25, 30)]:
        counted.clear()
        with torch.no_grad():
            _, state = model(ids[start:start + new].unsqueeze(0), state)
        assert sum(counted) == model.forward_cost(start, new), (start, new)
    counted.clear()
    with torch.no_grad():
        model(ids[:48].view(4, 12))  # four rows from the initial state, each in one pass
    assert sum(counted) == 4 * model.forward_cost(0, 12)


def test_a_windows_pass_scores_the_targets_the_plan_names():
    model = gru()
    ids, split = val(300)
    for stride in (1, 4, 7):
        planned = WindowsPass.plan(model, split.n_targets, 16, [1, 5, 16], stride)
        with forward_tokens_run(model) as counted:
            scores = score_contexts(model, split, 16, [1, 5, 16], stride)
        assert tuple(scores[w].tokens for w in (1, 5, 16)) == planned.targets_by_context
        assert sum(counted) == planned.forward_tokens


def test_the_budget_samples_in_the_studys_order():
    """Each pass in the budget is exact when it fits in what is left, else the smallest stride within its
    share (what is left over the passes still to plan); the floor (the stateless table, the bigram) is
    always exact."""
    model = gru()
    n = 111_539  # Tiny Shakespeare's validation split; Astra-alpha's shape does not change the counts
    exact = plan_evaluation(model, n, seq_len=128, window=128, streams=64, budget=None, curve_longest=1024)
    # The stateful pass comes first, then the windowed one: both exact, the long points get the rest.
    windowed_cost = exact.figure("stateful").forward_tokens + exact.figure("windowed").forward_tokens
    assert exact.exact and {p.stride for p in exact.passes} == {1}
    plan = plan_evaluation(model, n, seq_len=128, window=128, streams=64, budget=windowed_cost + 1_000_000,
                           curve_longest=1024)
    windowed, *long = [p for p in plan.passes if p.kind == "windows"]
    assert windowed.stride == 1 and len(long) == 4 and len({p.stride for p in long}) == 1
    k = long[0].stride  # the smallest stride within the 1,000,000 tokens left

    def long_cost(stride):
        return sum(WindowsPass.plan(model, n, w, [w], stride, keep=True).forward_tokens for w in (128, 256, 512, 1024))

    assert long_cost(k) == sum(p.forward_tokens for p in long) <= 1_000_000 < long_cost(k - 1)
    # Too little for it: windowed takes what it needs of what is left, the long points (optional) the rest.
    small = plan_evaluation(model, n, seq_len=128, window=128, streams=64, budget=200_000, curve_longest=1024)
    windowed = next(p for p in small.passes if p.kind == "windows")
    left = 200_000 - small.figure("stateful").forward_tokens
    assert 1 < windowed.stride and windowed.forward_tokens <= left < WindowsPass.plan(
        model, n, 128, windowed.contexts, windowed.stride - 1, keep=True).forward_tokens
    assert small.figure("stateful").targets == n and small.figure("stateless").targets == n
    assert not small.exact
    # Too little even for the stateful pass: every k-th of its 64 streams, whole.
    tiny = plan_evaluation(model, n, seq_len=128, window=128, streams=64, budget=30_000, curve_longest=1024)
    stateful = tiny.passes[tiny.figure("stateful").passes[0]]
    # half the budget (it and the windowed pass share it) affords 8 streams of 1,743 tokens: every 8th stream
    assert stateful.kind == "stateful" and stateful.stride == 8 and stateful.forward_tokens <= 30_000 / 2
    assert tiny.figure("stateful").targets == 8 * 1743 and tiny.figure("stateless").targets == n


def test_the_default_budget_samples_astra_alpha_within_a_standard_error_of_the_studys_figures(compose_config):
    """Astra-alpha's full recipe (2,000 steps of 64 x 128) on Tiny Shakespeare's 111,539 validation
    targets at the default budget (0.6): stateful, stateless and bigram exact (the README's figures, to the last
    digit); windowed and the curve up to 128 on every second target, the text statistics on 6 of 12 samples per
    setting without the drift, the points past 128 on what is left; evaluation.budget=null: everything exact."""
    cfg = compose_config()
    text = read_corpus(SHIPPED_CORPUS)
    tokenizer = CharTokenizer.from_text(text)
    val = Split.of(torch.tensor(tokenizer.encode(split_text(text, 0.9)[1])), tokenizer)
    model = RecurrentLM(65, "gru", embedding_dim=64, hidden_size=128, num_layers=1)
    plan = plan_of(model, val, 128, cfg.evaluation, training_tokens=2000 * 64 * 128, tokenizer=tokenizer,
                   seed=cfg.seed)
    strides = {f.name: plan.passes[f.passes[-1]].stride for f in plan.figures if f.passes}
    assert all(plan.figure(name).targets == val.n_targets == 111_539 for name in ("stateful", "stateless", "bigram"))
    assert strides["stateful"] == 1
    assert all(strides[f"curve {w}"] == 2 for w in (1, 2, 4, 8, 16, 32, 64, 128)) and strides["windowed"] == 2
    assert len({strides[f"curve {w}"] for w in (256, 512, 1024)}) == 1 and strides["curve 256"] > 2
    assert text_pass(plan).targets == 6 and text_pass(plan).drift == 0
    assert plan.forward_tokens <= 0.6 * 2000 * 64 * 128 + 65
    full = plan_of(model, val, 128, OmegaConf.merge(cfg.evaluation, {"budget": None}),
                   training_tokens=2000 * 64 * 128, tokenizer=tokenizer, seed=cfg.seed)
    assert full.exact and text_pass(full).targets == 12 and text_pass(full).drift == 2


def test_the_windowed_sample_of_the_default_budget_has_a_standard_error_under_a_hundredth_of_a_bit():
    """Every second target of 111,539 (the default plan's windowed stride, above), whose NLLs spread as the trained
    Astra-alpha's windowed targets do (2.2 bits a target: the full recipe's weights gave a sampling_se of 0.0093 at
    one target in two, 0.0116 at one in three): Score.sampling_se, the sample's standard error as an estimate of
    the whole split's figure, is under 0.01 bits; at one in three it would not be."""
    n, ln2 = 111_539, math.log(2)
    torch.manual_seed(0)
    nll = torch.distributions.Gamma(1.0, 1.0 / (2.2523 * ln2)).sample((n,)).double()  # mean and sd 2.25 bits
    ones = torch.ones(1, dtype=torch.long)

    def sample(stride: int):
        kept = nll[::stride]
        return _score_nll(kept, torch.zeros(len(kept), dtype=torch.long), ones).of(n)

    assert sample(1).sampling_se == 0
    assert 0.008 < sample(2).sampling_se < 0.01 < sample(3).sampling_se
    assert sample(2).bpc == pytest.approx(2.2523, abs=3 * sample(2).sampling_se)


def test_text_samples_are_cut_then_dropped_as_the_budget_shrinks():
    """The text pass: whole when it fits; every k-th sample (two at the least) and no drift when it does
    not; left out when even two samples do not fit its share; never counted as a split figure."""
    model, (_, split) = gru(), val(700)
    def demand():  # 12 samples and 2 drift generations, at 1,000 and 5,000 forward tokens each
        def make(stride):
            samples, drift = -(-12 // stride), 2 if stride == 1 else 0
            return [TextPass(samples, 1000 * samples + 5000 * drift, stride, drift=drift)]
        return [Unit(make, lambda ps, i: [Figure(TEXT, None, 0, ps[0].targets, 0, (i,), OTHER)] if ps else [],
                     False, 6, optional=True, priority=PRIORITY[TEXT], owner=TEXT)]
    whole = plan_evaluation(model, split.n_targets, seq_len=16, window=16, streams=4, budget=None, extra=demand())
    text = text_pass(whole)
    assert (text.targets, text.drift, text.forward_tokens) == (12, 2, 22_000) and whole.exact
    assert whole.figure("text").targets == 12
    stateful = whole.figure("stateful").forward_tokens
    cut = plan_evaluation(model, split.n_targets, seq_len=16, window=16, streams=4, budget=stateful + 8000,
                          windowed=False, curve=False, extra=demand())
    assert (text_pass(cut).targets, text_pass(cut).drift) == (6, 0) and cut.forward_tokens <= stateful + 8000 + 700
    none = plan_evaluation(model, split.n_targets, seq_len=16, window=16, streams=4, budget=stateful + 1000,
                           windowed=False, curve=False, extra=demand())
    assert text_pass(none) is None and none.figure("text") is None


def test_the_evaluation_config_has_one_budget_and_models_set_it_there(compose_config):
    """One knob per limit: a model config sets evaluation.budget (and data.seq_len) itself, and no group reads
    a model key (the trainer and the batches take the model's length from runs/recipe.recipe_length)."""
    assert len(OmegaConf.load(CONF / "evaluation" / "default.yaml")) <= 9
    for path in sorted((CONF / "model").glob("*.yaml")):
        keys = OmegaConf.load(path)
        keys = keys.get("model", keys)
        assert not [k for k in keys if k.startswith("eval") or k == "seq_len"], path.name
    for group in ("trainer", "data", "evaluation"):
        for path in (CONF / group).glob("*.yaml"):
            assert "model." not in path.read_text(), path
    leviathan = OmegaConf.load(CONF / "model" / "leviathan.yaml")
    assert compose_config("model=leviathan").evaluation.budget == leviathan.evaluation.budget == 0.33
    assert compose_config("model=leviathan", "evaluation.budget=null").evaluation.budget is None
    assert compose_config("model=nanogpt_shakespeare").data.seq_len == 256


def test_a_costly_stateful_figure_is_sampled_within_the_budget():
    """The transformer's stateful step past its block costs a block per target: within a small budget it
    scores every k-th target from its own block (what it sees statefully), and those targets scored
    exactly agree."""
    model = transformer(block=8)
    ids, split = val(300)
    plan = plan_evaluation(model, split.n_targets, seq_len=8, window=8, streams=4, budget=600, windowed=False,
                           bigram=False, curve=False)
    stateful_pass = plan.passes[plan.figure("stateful").passes[0]]
    assert stateful_pass.kind == "windows" and stateful_pass.stride == math.ceil(299 * 8 / 600)
    sample = run_plan(model, None, split, plan).scores["stateful"]
    exact_there = score_contexts(model, split, 8, [8], stateful_pass.stride)[8]
    assert sample.nll == pytest.approx(exact_there.nll, rel=1e-9) and sample.sampling_se > 0
    exact = run_plan(model, None, split, plan_evaluation(model, split.n_targets, seq_len=8, window=8, streams=4,
                                                         budget=None, windowed=False, bigram=False, curve=False))
    assert exact.scores["stateful"].tokens == 299 and exact.scores["stateful"].sampling_se == 0
    # A recurrent model's is a sample of its streams, each whole (its state needs the stream's history);
    # the same streams scored by score_stateful agree.
    model = gru()
    plan = plan_evaluation(model, 299, seq_len=8, window=8, streams=4, budget=160, windowed=False, bigram=False,
                           curve=False)
    streams = plan.passes[plan.figure("stateful").passes[0]]
    assert (streams.kind, streams.stride, plan.figure("stateful").targets) == ("stateful", 2, 150)  # streams 0, 2
    with forward_tokens_run(model) as counted:
        sample = run_plan(model, None, split, plan).scores["stateful"]
    assert sample.tokens == 150 and sum(counted) == 150 + V and sample.sampling_se > 0  # and the stateless table
    ids = split.ids
    by_hand = [score_stateful(model, Split(ids[s:s + 76], split.char_lengths), 8, 1) for s in (0, 150)]
    assert sample.nll_sum == pytest.approx(sum(score.nll_sum for score in by_hand), rel=1e-6)
    assert score_windowed(model, split, 8).tokens == 299


def test_an_entry_that_sets_only_its_name_plans_and_reads_nothing_and_writes_no_log_line():
    """plan.Entry's defaults, what a new figure (tests/test_new_figure.py) overrides: no passes of its own, no chunk
    of the stateful pass read (asked for one, it says so), its result under its name, no line for the log."""
    from gru_experiments.study.plan import Entry, Request

    class Named(Entry):
        name = "named"

    entry, request = Named(), Request(model=None, val=None, settings=None)
    assert entry.units(request) == [] and not entry.reads_stateful(request)
    with pytest.raises(NotImplementedError):
        entry.read(None)
    assert entry.run(request, None, [{None: 0.5}]) == 0.5
    assert entry.summary(0.5) == {"named": 0.5} and entry.describe(0.5) is None
