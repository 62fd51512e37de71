"""The study layer: what a trained model is measured by. The evaluation (`evaluation.py`: its entries,
settings and curves, `plan.py` with its passes, `scores.py`, `recall.py`, the text statistics),
generation (`generation.py`) and the run's page (`explore.py`, `explore_page.py`).

May import: the models, the data and the ground floor; never runs/ or report/ (it takes a model
and a split, not a run). A new figure is one entry here (docs/evaluation.md#how-to-add-a-figure).
"""
