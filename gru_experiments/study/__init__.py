"""The study layer: what a trained model is measured by (the evaluation, generation, the run's page). It takes a
model and a split, never a run: it may import the models, the data and the ground floor, never runs/ or report/.
A new figure is one entry here (docs/evaluation.md#how-to-add-a-figure).
"""
