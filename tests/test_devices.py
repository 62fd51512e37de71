"""The devices (models/devices.py): a device this machine cannot run is answered in one line that names what
it has."""

from __future__ import annotations

import pytest
import torch


def test_a_device_this_machine_cannot_run_is_answered_in_one_line(monkeypatch):
    """models/devices.resolve_device, the machine's GPUs a stand-in: two CUDA GPUs and no Apple MPS device."""
    from gru_experiments.models.devices import InvalidDevice, resolve_device

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name, key, reason in (
            ("mps", "device", "no Apple MPS device on this machine; use device=cpu or device=auto"),
            ("cuda:2", "device", "this machine has 2 CUDA GPU(s), cuda:0 to cuda:1"),
            ("meta", "--device", "torch's meta devices are not run here: give auto (a GPU where there is one), cpu, "
                                 "cuda, cuda:N or mps")):
        with pytest.raises(InvalidDevice) as refused:
            resolve_device(name, key)
        assert str(refused.value) == f"{key}={name}: {reason}" and refused.value.reason == reason
    assert resolve_device("cuda:1") == torch.device("cuda:1") and resolve_device(" auto ") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
