"""The names that changed, in one place: what an old run folder, checkpoint or command line says,
and what it says now (issue 35). Whatever reads an old config upgrades it here, once, and says so in
one printed line."""

from __future__ import annotations

# The original study's recipe and the variants trained under it ("seed" also named the random seed).
RECIPES = {"seed": "original"}
MODELS = {"astra_alpha_seed": "astra_alpha_original", "transformer_seed": "transformer_original",
          "transformer_beta_seed": "transformer_beta_original"}
# Flat evaluation keys, now nested (conf/evaluation/default.yaml).
EVALUATION_KEYS = {"text_samples": "text.samples", "text_chars": "text.chars",
                   "text_drift_chars": "text.drift_chars", "sample_chars": "samples.chars",
                   "sample_temperature": "samples.temperature"}
