"""The model protocol's builder (models/protocol.build_model): an architecture key the class does not take is
refused in one line that names the class."""

from __future__ import annotations

import pytest

from gru_experiments.errors import UserError
from gru_experiments.models.protocol import build_model


def test_an_unknown_architecture_key_names_the_class_without_a_property_object():
    architecture = {"_target_": "gru_experiments.models.minrnn.MinRNNLM", "cell": "mingru", "embedding_dim": 8,
                    "hidden_size": 8, "num_layers": 1, "implementation": "reference"}
    with pytest.raises(UserError) as refused:
        build_model(architecture, 11)
    message = str(refused.value)
    assert "unknown key model.architecture.implementation: MinRNNLM takes" in message and "property" not in message
