"""The study layer: what a trained model is measured by.

Owns: the evaluation's plan (`plan.py`), scoring a split in every inference mode (`scores.py`),
the context curve (`context_curve.py`) and the curve by kind of target (the classes:
`target_classes.py`; the figures: `class_curve.py`), the end-of-run evaluation (`evaluation.py`),
the planted-recall figures (`recall.py`), the inference modes and decoders for generation
(`inference.py`), the evaluation's progress bars (`progress.py`), and the generated text measured:
the statistics (`text_stats.py`), the training split's index they need (`text_index.py`) and the
sampling protocol (`text_protocol.py`).

May import: the models, the data and the ground floor; never runs/ or report/ (it takes a model
and a split, not a run). A new figure of the evaluation goes here; its line in the report goes
in report/.
"""
