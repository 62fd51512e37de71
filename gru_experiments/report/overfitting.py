"""When each model starts to overfit (report.md's *Overfitting onset*, its finding): each trained model's step
of best validation (summary.json's `best.step`) as a share of its recipe's steps, and how far its final weights fall
from it; the original study's table (late for Astra-γ, medium for Scribe-γ, early for Leviathan) judged by them.
"""

from gru_experiments.report.common import MISSING, escape, table
from gru_experiments.report.section import Findings, Section, cannot, verdict

EARLY, MEDIUM = 1 / 3, 2 / 3  # the onset's classes: the best step's share of the recipe's steps
# The original study's table: the model's config name -> its overfitting onset
ORIGINAL = {"astra_gamma": "late", "scribe_gamma": "medium", "leviathan": "early"}
NAMES = {"astra_gamma": "Astra-γ", "scribe_gamma": "Scribe-γ", "leviathan": "Leviathan"}


def judged(job) -> bool:
    """A completed trained model whose best checkpoint and final weights have a validation figure."""
    return (job.status == "completed" and job.values.get("lr") is not None and job.best("step") is not None
            and job.best("val_bpc") is not None and job.number("val_bpc") is not None
            and bool(job.number("train_steps")))


def fall(job) -> float:  # how far the final weights fall from the best (validation bpc)
    return job.number("val_bpc") - job.best("val_bpc")


def length(job) -> int:
    return job.number("recipe_steps") or job.number("train_steps")


def onset(job) -> str | None:
    """early | medium | late, or None where a cut run's best is its last step and that step is within the
    first two thirds of its recipe (the onset is later than the run went)."""
    best, trained, steps = job.best("step"), job.number("train_steps"), length(job)
    share = best / steps
    if best >= trained and trained < steps:  # no onset within a run cut short
        return "late" if share > MEDIUM else None
    return "early" if share <= EARLY else "medium" if share <= MEDIUM else "late"


def epochs(job, step) -> str:
    per_epoch = job.number("steps_per_epoch")
    return "" if not per_epoch else f" (epoch {step / per_epoch:.1f})"


def describe(job) -> str:
    best, trained, steps = job.best("step"), job.number("train_steps"), length(job)
    stopped = (f", stopped early at step {job.number('stopped_at_step'):,.0f}" if job.values.get("stopped_early")
               else f", cut at step {trained:,.0f}" if trained < steps else "")
    found = onset(job)
    onset_text = found or f"later than step {trained:,.0f}"
    return (f"{job.model}: best validation at step {best:,.0f}{epochs(job, best)} of its recipe's {steps:,.0f} "
            f"({best / steps:.0%}{stopped}), final - best {fall(job):+.4f} bits per character: onset "
            f"{onset_text}")


def overfitting_section(jobs, plots) -> list[str]:
    chosen = [job for job in jobs if judged(job)]
    if not chosen:
        return []
    rows = []
    for job in chosen:
        best, trained, steps = job.best("step"), job.number("train_steps"), length(job)
        stop = (f"early stopping, step {job.number('stopped_at_step'):,.0f}" if job.values.get("stopped_early")
                else "trainer.max_steps" if trained < steps else "its recipe")
        rows.append([escape(job.model), f"{job.number('parameters') or 0:,.0f}", f"{best:,.0f}{epochs(job, best)}",
                     f"{trained:,.0f} of {steps:,.0f}", stop, f"{best / steps:.0%}", f"{job.best('val_bpc'):.4f}",
                     f"{job.number('val_bpc'):.4f}", f"{fall(job):+.4f}", onset(job) or MISSING])
    header = ["model", "parameters", "best step", "steps trained", "stopped by", "best step / recipe",
              "best val bpc", "final val bpc", "final - best", "onset"]
    return ["## Overfitting onset: the step of the best validation, by model", "",
            "Each trained model's best validation (the best checkpoint by validation loss) against its recipe, and "
            "how far the final weights fall from it (validation bits per character, final - best: positive where "
            f"training on made the model worse). Onset: early where the best comes within the first third of the "
            f"recipe's steps, medium within two thirds, late beyond ({MISSING}: a cut run whose best is its last "
            "step, so its onset is later than it went).", "",
            *table(header, rows, "lrrrlrrrrl"), ""]


OVERFITTING = Findings("Findings on overfitting", "When each model starts to overfit, judged by the step of its "
                       "best validation against its recipe (the best checkpoint's).")


@OVERFITTING.claim("Overfitting onset is late for Astra-γ, medium for Scribe-γ and early for Leviathan")
def onset_finding(jobs) -> tuple[str, str]:
    """The original study's table, model by model, wherever the model ran; "not run" where it did not."""
    chosen = [job for job in jobs if judged(job)]
    parts, agree, counted, absent = [], 0, 0, []
    for name, claimed in ORIGINAL.items():
        runs = [job for job in chosen if job.name == name]
        if not runs:
            absent.append(NAMES[name])
            parts.append(f"{NAMES[name]} (claimed {claimed}): not run")
            continue
        for job in runs:
            found = onset(job)
            if found is None:
                parts.append(f"{describe(job)} (claimed {claimed}: not judged, the run stopped before its onset)")
                continue
            counted += 1
            agree += found == claimed
            parts.append(f"{describe(job)} (claimed {claimed}: {'agrees' if found == claimed else 'differs'})")
    if not counted:
        return cannot(f"a run of Astra-γ, Scribe-γ or Leviathan past its onset ({'; '.join(parts)}; "
                      "python sweep.py experiments=scale, or train.py model=leviathan early_stopping.patience=3)")
    others = [describe(job) for job in chosen if job.name not in ORIGINAL]
    evidence = (f"The step of the best validation as a share of the recipe's steps (early up to {EARLY:.0%}, medium "
                f"up to {MEDIUM:.0%}, late beyond): " + "; ".join(parts) + f". The onset agrees with the table for "
                f"{agree} of {counted} runs judged" + (f"; not run: {', '.join(absent)}" if absent else "") + "."
                + (" The other models of this sweep: " + "; ".join(others) + "." if others else ""))
    return verdict(agree, counted, counted - agree), evidence


SECTION = Section("overfitting onset", overfitting_section, findings=OVERFITTING, columns={
    "best_step_share": lambda job: job.best("step") / length(job) if judged(job) else None,
    "final_minus_best_bpc": lambda job: fall(job) if judged(job) else None,
})
