"""gru-experiments: hand-written GRU/LSTM language models, sampled statefully and statelessly.

The Python API (gru_experiments/api.py, docs/python.md):

    import gru_experiments
    summary = gru_experiments.train(["model=astra_alpha", "trainer.max_steps=300"])
    lm = gru_experiments.load(summary["run_dir"])
    lm.generate("ROMEO: ", mode="stateless", seed=1)
    lm.score("KING: Now is the winter of our discontent", mode="stateful").bpc

Exported lazily (PEP 562): scripts import light modules (runs.jobs) before torch, and every import runs this.
The package's layers: README, "Where a change goes"; pyproject.toml's [tool.importlinter] holds them.
"""

__all__ = ["load", "train", "TrainedModel", "TextScore"]


def __getattr__(name: str):
    if name in __all__:
        from gru_experiments import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
