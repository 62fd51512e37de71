"""The study's findings (report.md's *Findings*), each a rule registered by its claim and judged by one
sweep's summaries and histories: the original study's five, the project's own on training=streams and
the notebook's closing claim (GRUs against transformers). report.md numbers every finding by its position alone
(report.finding_number): the sections' findings are numbered on after these.
"""

from statistics import fmean

from gru_experiments.report.lr_sweep import at_best, rivals
from gru_experiments.report.section import Findings, cannot, verdict
from gru_experiments.report.significance import (
    WORTH,
    at_two_sizes,
    difference,
    pairs_of_size,
    side,
    state_gain,
    summary_figure,
)
from gru_experiments.report.sweep_folder import mode_pairs

STUDY = Findings("Findings", "The original study's five findings, the project's sixth and the notebook's closing "
                 "claim, each judged by this sweep's numbers (computed when the report is built; figures are of "
                 "the final weights, \"best\" ones of the checkpoint with the lowest validation loss).")


def _recurrent(jobs) -> list:
    return [job for job in jobs if job.recurrent]


def _reset_cost(job) -> float | None:
    """Bits per character lost by resetting the state at every step (stateless - stateful)."""
    stateful, stateless = job.number("stateful_bpc"), job.number("stateless_bpc")
    return None if stateful is None or stateless is None else stateless - stateful


@STUDY.claim("Training loss alone cannot validate a recurrent model")
def training_loss_finding(jobs) -> tuple[str, str]:
    """Did validation get worse after its best while the training loss kept falling?"""
    judged = [job for job in _recurrent(jobs)
              if job.number("val_bpc") is not None and job.best("val_bpc") is not None]
    if not judged:
        return cannot("no recurrent model has both final and best-checkpoint validation figures")
    parts, worse = [], 0
    for job in judged:
        final, best, step = job.number("val_bpc"), job.best("val_bpc"), job.best("step")
        train = [value for _, value in job.history.get("train/loss", [])]
        trend = f", training loss {train[0]:.3f} to {train[-1]:.3f}" if len(train) >= 2 else ""
        if final - best > 1e-9:
            worse += 1
            parts.append(f"{job.model} best {best:.4f} at step {step:.0f}, final {final:.4f} "
                         f"(+{final - best:.4f}){trend}")
        else:
            parts.append(f"{job.model} best at its final step ({final:.4f}){trend}")
    evidence = (f"Validation bits per character got worse after the best checkpoint for {worse} of {len(judged)} "
                f"recurrent models: " + "; ".join(parts) + ".")
    if worse == 0:
        evidence += " In this sweep the training loss and the validation figure never disagreed."
    return ("supported" if worse else "not shown by this sweep", evidence)


@STUDY.claim("A GRU without carried state is functionally non-recurrent")
def stateless_finding(jobs) -> tuple[str, str]:
    """Reset at every step, the model is a first-order table: is it any better than counting?"""
    judged = [job for job in _recurrent(jobs)
              if _reset_cost(job) is not None and job.number("bigram_bpc") is not None]
    if not judged:
        return cannot("no recurrent model with stateful, stateless and bigram figures")
    worse = [job for job in judged if job.number("stateless_bpc") >= job.number("bigram_bpc")]
    costs = [_reset_cost(job) for job in judged]
    gap = ", ".join(f"{job.model} {job.number('stateless_bpc'):.4f} vs {job.number('bigram_bpc'):.4f}"
                    for job in judged)
    evidence = (f"Stateless (every target from its previous token alone, the context curve's 1-token point) is "
                f"worse than the count bigram for {len(worse)} of {len(judged)} recurrent models (stateless vs "
                f"bigram bpc: {gap}); resetting the state costs {fmean(costs):.3f} bits per character on average "
                f"(from {min(costs):.3f} to {max(costs):.3f}).")
    if len(worse) < len(judged):
        evidence += (" Where stateless beats the bigram counts, the network is still a first-order model, "
                     "only a better-smoothed one.")
    return (verdict(len(worse), len(judged)), evidence)


@STUDY.claim("Correct inference gains more than extra depth or epochs")
def inference_vs_scale_finding(jobs) -> tuple[str, str]:
    """The state's gain against the gain of more training (epochs) and of a bigger model."""
    judged = [job for job in _recurrent(jobs) if _reset_cost(job) is not None]
    if not judged:
        return cannot("no recurrent model with stateful and stateless figures")
    state_gain = fmean(_reset_cost(job) for job in judged)
    parts = [f"Carrying the state gains {state_gain:.3f} bits per character on average ({len(judged)} models)"]
    checks, missing = [], []
    # Epochs: the stateful figure at the first validation against the stateless one at the last.
    over_training = [(job, sf, sl) for job in judged
                     if (sf := job.history.get("val/stateful_bpc")) and (sl := job.history.get("val/stateless_bpc"))]
    if over_training:
        early = [job for job, sf, sl in over_training if sf[0][1] < sl[-1][1]]
        checks.append(len(early) == len(over_training))
        parts.append(f"stateful at the first validation already beats stateless at the last for {len(early)} of "
                     f"{len(over_training)} models ("
                     + ", ".join(f"{job.model} {sf[0][1]:.4f} at step {sf[0][0]} vs {sl[-1][1]:.4f} at step {sl[-1][0]}"
                                 for job, sf, sl in over_training) + ")")
        stateless_training = fmean(sl[0][1] - sl[-1][1] for _, _, sl in over_training)
        parts.append(f"training from the first validation to the last improved stateless by {stateless_training:.3f} "
                     f"on average")
    else:
        missing.append("the modes over training (history.csv's val/stateful_bpc)")
    # Depth and width: the largest model against the smallest of the same tokenizer, both stateful.
    scale_gains = []
    for _, same in sorted(at_two_sizes([job for job in judged if job.number("parameters") is not None]).items()):
        small = min(same, key=lambda job: job.number("parameters"))
        large = max(same, key=lambda job: job.number("parameters"))
        gain = small.number("stateful_bpc") - large.number("stateful_bpc")
        scale_gains.append(gain)
        parts.append(f"{large.model} over {small.model} "
                     f"({large.number('parameters') / small.number('parameters'):.0f}x "
                     f"the parameters) gains {gain:.3f} stateful")
    if scale_gains:
        checks.append(state_gain > max(scale_gains))
    else:
        missing.append("models of one tokenizer at two sizes (the gain of scale)")
    evidence = "; ".join(parts) + "."
    if missing:
        evidence += " Missing: " + ", ".join(missing) + "."
    return (verdict(sum(checks), len(checks)) if checks else "cannot be judged", evidence)


@STUDY.claim("Subword models amplify inference-time errors")
def subword_finding(jobs) -> tuple[str, str]:
    """Does resetting the state cost subword models more than character models?"""
    judged = [job for job in _recurrent(jobs) if _reset_cost(job) is not None]
    groups = {kind: [job for job in judged if job.values.get("tokenizer") == kind] for kind in ("char", "spm")}
    absent = [kind for kind, group in groups.items() if not group]
    if absent:
        names = {"char": "character", "spm": "subword (spm)"}
        return cannot(f"no {' and no '.join(names[k] for k in absent)} model with stateful and stateless "
                      f"figures, so the two cannot be compared")
    char, spm = (fmean(_reset_cost(job) for job in groups[kind]) for kind in ("char", "spm"))
    evidence = (f"Resetting the state costs subword models {spm:.3f} and character models {char:.3f} bits per "
                f"character on average ({len(groups['spm'])} and {len(groups['char'])} models).")
    if spm <= char:
        evidence += " The subword models lose less than the character models."
    return ("supported" if spm > char else "contradicted", evidence)


@STUDY.claim("Correctness precedes scale")
def correctness_finding(jobs) -> tuple[str, str]:
    """Does the smallest model used correctly (stateful) beat every larger one used statelessly?"""
    judged = [job for job in _recurrent(jobs) if _reset_cost(job) is not None and job.number("parameters")]
    if len({job.number("parameters") for job in judged}) < 2:
        return cannot("recurrent models of at least two sizes with stateful and stateless figures")
    small = min(judged, key=lambda job: job.number("parameters"))
    larger = [job for job in judged if job.number("parameters") > small.number("parameters")]
    beaten = [job for job in larger if small.number("stateful_bpc") < job.number("stateless_bpc")]
    evidence = (f"The smallest model, {small.model} ({small.number('parameters'):,.0f} parameters), stateful at "
                f"{small.number('stateful_bpc'):.4f} bits per character, beats {len(beaten)} of {len(larger)} "
                f"larger models used statelessly ("
                + ", ".join(f"{job.model} {job.number('stateless_bpc'):.4f}" for job in larger) + ").")
    return (verdict(len(beaten), len(larger)), evidence)


@STUDY.claim("Training with the state carried makes the state worth carrying")
def carried_state_finding(jobs) -> tuple[str, str]:
    """Does training with the state carried make carrying it at inference pay (stateful - windowed)?"""
    judged = _recurrent(jobs) + [job for job in jobs if job.values.get("family") == "mlp"]
    pairs = mode_pairs([job for job in judged if state_gain(job) is not None])
    if not pairs:
        return cannot("no model trained both ways (python sweep.py models=grid training=windows,streams)")
    parts, supported, contradicted = [], 0, 0
    for windows, streams in pairs:
        on_windows = difference(side(windows, state_gain), worth=WORTH)
        on_streams = difference(side(streams, state_gain), worth=WORTH)
        change = difference(side(streams, state_gain), side(windows, state_gain), worth=WORTH)
        if on_streams.below and change.below:
            supported += 1
        elif change.above:
            contradicted += 1
        window = (windows.values.get("mode_evaluation") or {}).get("window", "?")
        parts.append(f"{windows.name}: stateful - windowed ({window} tokens) {on_windows.text(5)} "
                     f"trained on windows, {on_streams.text(5)} trained on streams (change {change.text(5)})")
    evidence = ("Bits per character, negative where the carried state beats the window, ± one standard error "
                "(paired by target within a run; between trainings over seeds): " + "; ".join(parts)
                + f". Supported for {supported} of {len(pairs)} models "
                "(trained on streams, stateful - windowed below zero and below the windows-trained figure, each by "
                f"two standard errors and by at least {WORTH} bits per character: a gain worth the state).")
    return (verdict(supported, len(pairs), contradicted), evidence)


def _minutes(job) -> str:
    seconds = job.number("train_seconds")
    return "?" if seconds is None else f"{seconds / 60:.1f} min"


def _recipe(job, jobs) -> str:
    """The recipe and learning rate it was trained with, and how many runs of its size it is the best of."""
    lr = job.values.get("lr")
    chosen = len(rivals(job, jobs))
    return (f"recipe {job.recipe or '?'}, lr {lr:g}" if isinstance(lr, (int, float)) else "no recipe") + (
        f", the best of {chosen} runs on the validation split" if chosen > 1 else "")


@STUDY.claim("GRUs remain competitive with transformers")
def transformer_finding(jobs) -> tuple[str, str]:
    """At each size, the GRU's stateful bits per character against the transformer's, ± se."""
    scored = [job for job in at_best(jobs) if job.number("stateful_bpc") is not None and job.number("parameters")]
    pairs = sorted(pairs_of_size(scored, "gru", "transformer"), key=lambda pair: pair[0].number("parameters"))
    if not pairs:
        return cannot("no GRU and transformer of the same size and tokenizer (python sweep.py models=ladder, "
                      "models=beta)")
    parts, behind = [], 0
    for gru, transformer in pairs:
        g, t = gru.number("stateful_bpc"), transformer.number("stateful_bpc")
        gap = difference(side(gru, summary_figure("stateful_bpc")), side(transformer, summary_figure("stateful_bpc")))
        behind += gap.above
        outcome = ("the transformer is better" if gap.above else "the GRU is better" if gap.below
                   else "a tie within two standard errors")
        parts.append(f"{gru.name} ({gru.number('parameters'):,.0f} parameters; {_recipe(gru, jobs)}) {g:.4f} in "
                     f"{_minutes(gru)} of training against {transformer.name} "
                     f"({transformer.number('parameters'):,.0f}; {_recipe(transformer, jobs)}) {t:.4f} in "
                     f"{_minutes(transformer)}: GRU - transformer {gap.text()}, {outcome}")
    evidence = ("Stateful bits per character of the final weights, GRU against the transformer of its size (each "
                "family at its best where the sweep tuned it: learning rate and recipe chosen the same way for both), "
                "± one standard error of the difference (one training a side: the two figures' own, unpaired; "
                "over seeds: the spread between trainings, paired by seed): " + "; ".join(parts)
                + f". The GRU is better or tied at {len(pairs) - behind} of {len(pairs)} sizes.")
    return (verdict(len(pairs) - behind, len(pairs)), evidence)
