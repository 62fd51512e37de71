"""The device a command runs on, from its name: `resolve_device` for sample.py's device=, the Python API's
load(device=...) and the benchmarks' --device. auto, cpu, cuda, cuda:N or mps; a name torch does not know, or a
device this machine lacks, is an InvalidDevice (a UserError: one line), never torch's traceback or a later
"not a readable checkpoint"."""

import torch

from gru_experiments.errors import UserError

NAMES = "auto (a GPU where there is one), cpu, cuda, cuda:N or mps"


class InvalidDevice(UserError):
    """A device name this machine cannot use; `reason` says why without the key (argparse adds its own)."""

    def __init__(self, key: str, name, reason: str):
        self.reason = reason
        super().__init__(f"{key}={name}: {reason}")


def resolve_device(name, key: str = "device") -> torch.device:
    """The torch.device `name` asks for on this machine; InvalidDevice naming `key` where it cannot be used."""
    text = str(name).strip()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise InvalidDevice(key, name, f"not a device: give {NAMES}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = "a CPU build of torch" if torch.version.cuda is None else "no CUDA driver or GPU visible"
            raise InvalidDevice(key, name, f"torch sees no CUDA GPU on this machine ({build}); use {key}=cpu, or "
                                           f"{key}=auto (a GPU where there is one)")
        if device.index is not None and device.index >= count:
            raise InvalidDevice(key, name, f"this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise InvalidDevice(key, name, f"no Apple MPS device on this machine; use {key}=cpu or {key}=auto")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise InvalidDevice(key, name, f"torch's {device.type} devices are not run here: give {NAMES}")
    return device
