"""The study layer: what a trained model is measured by.

Owns: the evaluation as a registry of entries and its one entry point (`evaluation.py`), its plan
and budget (`plan.py`), the kinds of pass with their costs (`passes.py`), which targets a pass
scores (`positions.py`), the evaluation's settings (`settings.py`), scoring a split in every
inference mode (`scores.py`), the context curve (`context_curve.py`) and the curve by kind of target
(`target_classes.py`, `class_curve.py`), the planted-recall figures (`recall.py`), generation in
every inference mode (`generation.py`), the progress bars (`progress.py`), the generated text measured
(`text_stats.py`, `text_index.py`, `text_protocol.py`) and the run's page (`explore.py`,
`explore_page.py`).

May import: the models, the data and the ground floor; never runs/ or report/ (it takes a model
and a split, not a run). A new figure is one entry here (docs/evaluation.md#how-to-add-a-figure);
its line in the report one section in report/.
"""
