"""The sampling protocol of the text statistics (text_stats.py): every inference mode x decoder on the
study's prompts, beside held-out text, a floor and a ceiling, and the drift along long generations; and
the two entries that draw them (docs/evaluation.md#the-generated-text-measured).
"""

import time
from dataclasses import asdict, dataclass, replace
from typing import ClassVar

import torch

from gru_experiments.data.tokenizers import encode_prompt
from gru_experiments.study.generation import (
    NO_PROGRESS,
    STUDY_PROMPTS,
    Decoding,
    Progress,
    continuations,
    spellable_prompts,
    tokens_for_chars,
)
from gru_experiments.study.modes import MODES_BY_CONTEXT, OVER_TRAINING_MODES, STATEFUL, STATELESS, WINDOWED
from gru_experiments.study.plan import FINAL, OTHER, OVER_TRAINING, PRIORITY, TEXT, Entry, Figure, Pass, Request, Unit
from gru_experiments.study.scores import Split
from gru_experiments.study.text_index import SPAN, TrainingIndex
from gru_experiments.study.text_stats import (
    STATISTICS,
    floor_and_ceiling_texts,
    reference_slices,
    text_statistics,
    value_and_se,
    word_validity,
)
from gru_experiments.validation import Rule, check_rules, is_int

DECODERS = {
    "greedy": Decoding(greedy=True),
    "temperature_0.8": Decoding(temperature=0.8),  # the original study's, as top_k_30
    "top_k_30": Decoding(top_k=30),
    "top_p_0.9": Decoding(top_p=0.9),
    "pure": Decoding(),
}
DRIFT_MODES = (STATEFUL, WINDOWED)  # does the carried state keep a long text together, beside a restarting window?
DRIFT_DECODER = "pure"
DRIFT_SHOWN = ("word_validity", "reference_bpc", "seq_rep_4")  # the drift's columns in the log


STRETCH_CHARS = 500  # the drift is measured per stretch of this many characters
# Bounds on the text statistics' size, checked before any work: every sample per mode x decoder is drawn and
# measured (about a second each for Astra-alpha on a CPU at the defaults), so these stay within hours.
MAX_TEXT_SAMPLES = 1_000
MAX_TEXT_CHARS = 100_000  # a sample's characters, and the drift's


@dataclass(frozen=True)
class TextSettings:
    """evaluation.text (the config sets those in RULES): `samples` of `chars` characters per mode × decoder;
    `drift_samples` generations of `drift_chars` (0: no drift) cut into stretches of `stretch_chars`."""

    window: int
    samples: int
    chars: int
    drift_chars: int
    seed: int = 0
    drift_samples: int = 2
    stretch_chars: int = STRETCH_CHARS
    RULES: ClassVar = [
        Rule("samples", lambda v: is_int(v) and 0 <= v <= MAX_TEXT_SAMPLES,
             f"an integer from 0 (no text statistics) to {MAX_TEXT_SAMPLES:,}"),
        Rule("chars", lambda v: is_int(v) and SPAN <= v <= MAX_TEXT_CHARS,
             f"an integer from {SPAN} (copy_32's span) to {MAX_TEXT_CHARS:,}"),
        Rule("drift_chars", lambda v: is_int(v) and (v == 0 or STRETCH_CHARS <= v <= MAX_TEXT_CHARS),
             f"0 (no drift) or an integer from {STRETCH_CHARS} (one stretch) to {MAX_TEXT_CHARS:,}")]

    def __post_init__(self):
        check_rules(self.__dict__, self.RULES, "evaluation.text.")


def share_samples(n: int, prompts) -> list[tuple[str, int]]:
    """(prompt, samples) for n samples over the prompts, as evenly as they go (a prompt with none left out)."""
    q, r = divmod(n, len(prompts))
    return [(prompt, q + (i < r)) for i, prompt in enumerate(prompts) if q + (i < r)]


def sampling_cost(model, mode: str, prompt_len: int, new: int, window: int | None = None) -> int:
    """Forward tokens one row of generation.sample_tokens runs in `mode`."""
    if mode == STATELESS:
        return new * model.forward_cost(0, 1)
    if mode == STATEFUL:
        return model.forward_cost(0, prompt_len) + sum(model.forward_cost(prompt_len + t, 1) for t in range(new - 1))
    return sum(model.forward_cost(0, min(window, end)) for end in range(prompt_len, prompt_len + new))


@dataclass
class _Draws:
    """How one kind of draw goes: the prompts' shares, the tokens per sample, the window."""
    model: object
    tokenizer: object
    shares: list[tuple[str, int]]
    tokens: int
    window: int
    seed: int

    def row_cost(self, mode: str, prompt: str) -> int:
        return sampling_cost(self.model, mode, len(encode_prompt(self.tokenizer, prompt)), self.tokens, self.window)

    def cost(self, mode: str) -> int:
        return sum(n * self.row_cost(mode, prompt) for prompt, n in self.shares)

    def draw(self, mode: str, decoding: Decoding, tick) -> list[str]:
        """The continuations (prompts cut off), prompt by prompt."""
        return self.draw_all(mode, {None: decoding}, tick)[None]

    def draw_all(self, mode: str, decodings: dict, tick) -> dict:
        """{name: draw(mode, decoding)} for every decoding of `decodings`, all of a prompt's in one batch
        (generation.generate_decodings: the same draws, one sequence of forward passes per prompt)."""
        texts = {name: [] for name in decodings}
        for prompt, n in self.shares:
            drawn = continuations(self.model, self.tokenizer, prompt, list(decodings.values()), seed=self.seed,
                                  mode=mode, max_new_tokens=self.tokens, num_samples=n, window=self.window)
            for name, rows in zip(decodings, drawn):
                texts[name] += rows
            tick(len(decodings) * n * self.row_cost(mode, prompt))
        return texts


def _phase(mode: str, window: int) -> str:
    return f"{WINDOWED} ({window})" if mode == WINDOWED else mode


def drift_stretches(texts: list[str], stretch: int, index: TrainingIndex, reference: list[str]) -> list[dict]:
    """[{"start", "end", "statistics"}] of each whole stretch of the generations, stretch k of all together."""
    longest = max(map(len, texts), default=0)
    return [{"start": start, "end": start + stretch, "statistics": text_statistics(
                [text[start:start + stretch] for text in texts if len(text) >= start + stretch], index, reference)}
            for start in range(0, longest - stretch + 1, stretch)]


def _draws(model, tokenizer, val: Split, s: TextSettings) -> tuple[_Draws, _Draws]:
    """How the samples and the drift's generations are drawn (the same in measure_text and its cost)."""
    prompts = spellable_prompts(tokenizer, STUDY_PROMPTS, val.ids)
    window = min(s.window, model.context) if getattr(model, "context", None) else s.window
    main = _Draws(model, tokenizer, share_samples(s.samples, prompts), tokens_for_chars(s.chars, val), window, s.seed)
    drift = _Draws(model, tokenizer, share_samples(max(s.drift_samples, 1), prompts),
                   tokens_for_chars(s.drift_chars, val) if s.drift_chars else 0, window, s.seed)
    return main, drift


# --- the table ----------------------------------------------------------------------------------------------
def format_figure(figure: dict | None, with_se: bool = True) -> str:
    """"0.937 ±0.009"; "0.937" without a standard error (or `with_se`); "—" without a value."""
    if figure is None or figure["value"] is None:
        return "—"
    return f"{figure['value']:.3f}" + ("" if figure["se"] is None or not with_se else f" ±{figure['se']:.3f}")


def format_text_statistics(record: dict) -> str:
    """The record of measure_text for the log: a row per setting, a column per statistic; the drift."""
    s = record["settings"]
    lines = [f"text statistics: {s['samples']} samples of {s['chars']} characters per setting, seed {s['seed']}; "
             "value ± standard error over samples",
             f"(continuations of {', '.join(repr(p) for p, _ in s['prompts'])}; "
             f"windowed: the last {s['window']} tokens)",
             f"{'setting':<26}" + "".join(f"{name:>14}" for name in STATISTICS)]
    rows = [(f"{mode} {name}", figures)
            for mode, by_decoder in record["modes"].items() for name, figures in by_decoder.items()]
    rows += [("reference (validation)", record["reference"]), ("random (floor)", record["floor"]),
             ("looped (ceiling)", record["ceiling"])]
    lines += [f"{label:<26}" + "".join(f"{format_figure(figures[name]):>14}" for name in STATISTICS)
              for label, figures in rows]
    return "\n".join(lines + _drift_lines(record))


def _drift_lines(record: dict) -> list[str]:
    drift, s = record["drift"], record["settings"]
    if not drift:
        return []
    width = 8 * len(DRIFT_SHOWN)
    lines = [f"drift: {s['drift_samples']} generations of {s['drift_chars']:,} characters, {s['drift_decoder']} "
             f"sampling; per stretch of {s['stretch_chars']}: {', '.join(DRIFT_SHOWN)}",
             (f"{'characters':<14}" + "".join(f"{_phase(mode, s['window']):<{width}}" for mode in drift)).rstrip()]
    for k in range(max(map(len, drift.values()))):
        cells = []
        for stretches in drift.values():
            figures = stretches[k]["statistics"] if k < len(stretches) else {}
            cells.append("".join(f"{format_figure(figures.get(name), False):<8}" for name in DRIFT_SHOWN))
        where = f"{k * s['stretch_chars']}-{(k + 1) * s['stretch_chars']}"
        lines.append((f"{where:<14}" + "".join(cells)).rstrip())
    return lines


# --- the entry: the text statistics at the end of a run ------------------------------------------------
@dataclass(frozen=True)
class TextPass(Pass):
    """The text statistics' samples as the plan cut them: `targets` per mode x decoder, the drift when exact."""
    kind: ClassVar[str] = TEXT
    drift: int = 0
    settings: TextSettings | None = None
    calls: tuple = ()  # (mode, rows, steps, forward tokens) of each batch it generates: its time (runs/scoring.py)

    @classmethod
    def plan(cls, model, tokenizer, val: Split, settings: TextSettings, stride: int) -> "TextPass":
        samples = -(-settings.samples // stride)
        drift = settings.drift_samples if settings.drift_chars and stride == 1 else 0  # the drift only when exact
        cut = replace(settings, samples=samples, drift_chars=settings.drift_chars if drift else 0)
        main, long = _draws(model, tokenizer, val, cut)
        calls = [(mode, len(DECODERS) * n, main.tokens, len(DECODERS) * n * main.row_cost(mode, prompt))
                 for mode in MODES_BY_CONTEXT for prompt, n in main.shares]
        calls += [(mode, n, long.tokens, n * long.row_cost(mode, prompt))
                  for mode in (DRIFT_MODES if drift else ()) for prompt, n in long.shares]
        return cls(samples, sum(call[3] for call in calls), stride, drift=drift, settings=cut, calls=tuple(calls))

    def run(self, request, progress=NO_PROGRESS) -> dict:
        started = time.perf_counter()
        val = request.val
        measured = measure_text(request.model, request.tokenizer, request.load_text_index(),
                                request.tokenizer.decode(val.ids), self.settings, val_ids=val.ids,
                                progress=Progress(progress.enabled, "text statistics", progress.lines))
        return {None: measured | {"seconds": time.perf_counter() - started}}


class TextEntry(Entry):
    """The generated text measured at the end of a run, within the budget; left out when even two samples do
    not fit, or the split is shorter than a sample (a line)."""
    name = TEXT

    def units(self, request: Request) -> list[Unit]:
        asked = replace(request.settings.text, seed=request.seed)
        if request.purpose != FINAL or request.tokenizer is None or not asked.samples:
            return []
        characters = request.val.characters  # the reference is slices of it: a sample's, the drift's stretches
        if asked.chars > characters:
            print(f"text statistics left out: the validation split has {characters:,} characters, "
                  f"fewer than a sample's evaluation.text.chars={asked.chars}")
            return []
        settings = asked if asked.stretch_chars <= characters else replace(asked, drift_chars=0)
        return [Unit(lambda stride: [TextPass.plan(request.model, request.tokenizer, request.val, settings, stride)],
                     lambda ps, i: [Figure(TEXT, None, 0, ps[0].targets, ps[0].forward_tokens, (i,), OTHER)] if ps
                     else [], False, max(1, settings.samples // 2), optional=True, priority=PRIORITY[TEXT], owner=TEXT)]

    def summary(self, result: dict) -> dict:
        return super().summary({key: value for key, value in result.items() if key != "texts"})

    describe = staticmethod(format_text_statistics)


def measure_text(model, tokenizer, index: TrainingIndex, val_text: str, settings: TextSettings, *,
                 val_ids: torch.Tensor | None = None, progress=NO_PROGRESS) -> dict:
    """{"settings", "modes": {mode: {decoder: text_statistics}}, "reference", "floor", "ceiling", "drift":
    {mode: [stretch, ...]}, "texts"}. `val_ids`: the split's ids (default: val_text encoded)."""
    s = settings
    val = Split.of((val_ids if val_ids is not None else torch.tensor(tokenizer.encode(val_text))).cpu(), tokenizer)
    reference = reference_slices(val_text, s.samples, s.chars, s.seed)  # first: a too-short split fails at once
    drift_reference = reference_slices(val_text, s.samples, s.stretch_chars, s.seed) if s.drift_chars else []
    main, drift = _draws(model, tokenizer, val, s)
    window = main.window
    texts, costs = {}, {}
    for mode in MODES_BY_CONTEXT:
        costs[mode] = len(DECODERS) * main.cost(mode)
        with progress.phase(_phase(mode, window), costs[mode]) as tick:
            texts[mode] = main.draw_all(mode, DECODERS, tick)
    drift_texts = {}
    for mode in DRIFT_MODES if s.drift_chars and s.drift_samples else ():
        costs[f"drift {mode}"] = drift.cost(mode)
        with progress.phase(f"drift, {_phase(mode, window)}", costs[f"drift {mode}"]) as tick:
            drift_texts[mode] = drift.draw(mode, DECODERS[DRIFT_DECODER], tick)
    other_reference = reference_slices(val_text, s.samples, s.chars, s.seed + 1)
    bounds = floor_and_ceiling_texts(index, s.samples, s.chars, s.seed)
    record_settings = {**asdict(s), "prompts": [list(share) for share in main.shares], "window": window,
                       "max_new_tokens": main.tokens, "decoders": {n: asdict(d) for n, d in DECODERS.items()},
                       "drift_prompts": [list(share) for share in drift.shares], "drift_max_new_tokens": drift.tokens,
                       "drift_decoder": DRIFT_DECODER, "forward_tokens": costs | {"total": sum(costs.values())}}
    return {
        "settings": record_settings,
        "modes": {mode: {name: text_statistics(samples, index, reference) for name, samples in by_decoder.items()}
                  for mode, by_decoder in texts.items()},
        "reference": text_statistics(reference, index, other_reference),
        "floor": text_statistics(bounds["random"], index, reference),
        "ceiling": text_statistics(bounds["looped"], index, reference),
        "drift": {mode: drift_stretches(generations, s.stretch_chars, index, drift_reference)
                  for mode, generations in drift_texts.items()},
        "texts": {**texts, "reference": reference, "other_reference": other_reference, "floor": bounds["random"],
                  "ceiling": bounds["looped"], "drift": drift_texts, "drift_reference": drift_reference},
    }


# --- over training: the word validity of a short sample -------------------------------------------------
OVER_TRAINING_DECODER = "temperature_0.8"  # the original study's


@dataclass(frozen=True)
class ShortTextPass(Pass):
    """One short sample per study prompt (the same at every validation) per mode, as `draws` draws them:
    {mode: word_validity}."""
    kind: ClassVar[str] = "short_text"
    draws: _Draws | None = None

    def run(self, request, progress=NO_PROGRESS) -> dict:
        vocabulary, draws = request.load_text_index().vocabulary, self.draws
        return {None: {mode: value_and_se(word_validity(text, vocabulary) for text in
                                          draws.draw(mode, DECODERS[OVER_TRAINING_DECODER], lambda _: None))["value"]
                       for mode in OVER_TRAINING_MODES}}


class WordValidityEntry(Entry):
    """The word validity over training (the original study's lesson 3), within the budget after the modes."""
    name = "word_validity"

    def units(self, request: Request) -> list[Unit]:
        if request.purpose != OVER_TRAINING or request.tokenizer is None or not request.settings.text.samples:
            return []
        prompts = spellable_prompts(request.tokenizer, STUDY_PROMPTS, request.val.ids)

        def make(stride: int) -> list[Pass]:
            samples = -(-len(prompts) // stride)
            draws = _Draws(request.model, request.tokenizer, share_samples(samples, prompts),
                           tokens_for_chars(request.settings.text.chars, request.val), 1, request.seed)
            return [ShortTextPass(samples, sum(draws.cost(mode) for mode in OVER_TRAINING_MODES), stride, draws=draws)]

        return [Unit(make, lambda ps, i: [], False, max(1, len(prompts) // 2), optional=True, priority=PRIORITY[TEXT],
                     owner=self.name)]

    def summary(self, result: dict) -> dict:
        return {f"{mode}_word_validity": value for mode, value in result.items()}
