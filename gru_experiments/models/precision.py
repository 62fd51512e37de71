"""Which dtype the model's matmuls take their inputs in: bfloat16 (accumulated in fp32) or the model's own.
`low_precision_matmuls` and `trainer.precision` choose: docs/performance.md, *bf16 matmuls*.
"""

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

MODES = ("auto", "always", "never")
log = logging.getLogger(__name__)

# bf16 pays off per matmul only from this size (measured: docs/performance.md, *bf16 matmuls*)
AUTO_MIN_WEIGHT_ELEMENTS = 65_536

FULL_PRECISION = ("32-true", "32", 32)


@dataclass(frozen=True)
class MatmulPrecision:
    """`dtype` for every weight of at least `min_weight_elements` elements; the others keep the model's."""

    dtype: torch.dtype = torch.bfloat16
    min_weight_elements: int = 0

    def for_weight(self, weight: Tensor) -> torch.dtype | None:
        """The dtype this weight's matmuls take their inputs in; None: the computation's own."""
        if weight.dtype == torch.float64 or weight.numel() < self.min_weight_elements:
            return None
        return self.dtype


# CPU flags of native bf16 matmuls; without them oneDNN emulates bf16, slower than fp32 itself.
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    try:
        with open(cpuinfo) as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def has_fast_bf16(device: torch.device | str) -> bool:
    """Whether this device multiplies bf16 in hardware, not by emulation."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        flags = cpu_flags()
        if not flags:  # no /proc/cpuinfo: ask torch's own probes (torch >= 2.3)
            return any(bool(getattr(torch.cpu, probe, lambda: False)())
                       for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
        return any(flag in flags for flag in NATIVE_BF16_CPU_FLAGS)
    return False


_warned_emulated: set[str] = set()


def warn_if_emulated(device) -> None:
    """`always` on a device without native bf16: say so, once per process and device type."""
    device = torch.device(device)
    if has_fast_bf16(device) or device.type in _warned_emulated:
        return
    _warned_emulated.add(device.type)
    where = ("this CPU has neither avx512_bf16 nor amx_bf16" if device.type == "cpu"
             else f"this {device.type} device has no native bf16")
    log.warning(f"low_precision_matmuls=always: {where}, so bf16 matmuls are emulated there and slower than "
                "float32; low_precision_matmuls=auto chooses float32 on it")


def resolve(mode: str, trainer_precision, device) -> MatmulPrecision | None:
    """The matmul precision of a training run: None means the model's own dtype throughout."""
    if mode not in MODES:
        raise ValueError(f"low_precision_matmuls must be one of {', '.join(MODES)}, got {mode!r}")
    if trainer_precision is not None:
        return None  # 32-true: pure float32; others: Lightning's autocast / true precision decides
    if mode == "always":
        warn_if_emulated(device)
        return MatmulPrecision()
    if mode == "auto" and has_fast_bf16(device):
        return MatmulPrecision(min_weight_elements=AUTO_MIN_WEIGHT_ELEMENTS)
    return None


def autocast_precision(device_type: str) -> MatmulPrecision | None:
    """Under autocast (trainer.precision=bf16-mixed / 16-mixed) autocast's dtype, at every size."""
    if torch.is_autocast_enabled(device_type):  # per device type from torch 2.4, the oldest pyproject.toml takes
        return MatmulPrecision(torch.get_autocast_dtype(device_type))
    return None


def apply_matmul_precision(model, mode: str, trainer_precision, trainer) -> dict:
    """Set a training run's matmul precision on its model (a LanguageModel: a family without bf16 matmuls
    ignores it, and `always` says so in one line); what summary.json records."""
    precision = resolve(mode, trainer_precision, trainer.strategy.root_device)
    model.set_matmul_precision(precision)
    if mode == "always" and precision is not None and not model.low_precision_weights():
        log.warning(f"low_precision_matmuls=always: {type(model).__name__} ({model.family}) has no bf16 matmuls "
                    "(models/protocol.py, set_matmul_precision), so it runs in its parameters' dtype")
    return describe(trainer.precision, mode, model)


def describe(trainer_precision: str, mode: str, model) -> dict:
    """Lightning's precision, low_precision_matmuls, the matmuls' dtype ("bfloat16+float32": only the big
    weights') and the weights that ran in bf16."""
    trainer_precision = str(trainer_precision)
    weights = model.low_precision_weights()
    if trainer_precision not in [str(p) for p in FULL_PRECISION]:  # Lightning's autocast or true precision
        dtype = {"bf16": "bfloat16", "16": "float16", "64": "float64"}.get(trainer_precision.split("-")[0],
                                                                           trainer_precision)
    elif not weights:
        dtype = "float32"
    else:
        matrices = [n for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith("embedding")]
        dtype = "bfloat16" if len(weights) == len(matrices) else "bfloat16+float32"
    return {"precision": trainer_precision, "low_precision_matmuls": mode, "matmul_dtype": dtype,
            "bf16_weights": weights}


def linear(x: Tensor, weight: Tensor, bias: Tensor, precision: MatmulPrecision | None) -> Tensor:
    """`F.linear`, its matmuls in low precision where `precision` picks it for this weight."""
    dtype = precision.for_weight(weight) if precision is not None else None
    if dtype is None or dtype == x.dtype:
        return torch.nn.functional.linear(x, weight, bias)
    return _LowPrecisionLinear.apply(x, weight, bias, dtype)


class _LowPrecisionLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, dtype):
        with torch.autocast(x.device.type, enabled=False):
            X = x.reshape(-1, x.shape[-1]).to(dtype)
            W = weight.to(dtype)
            y = torch.add(torch.mm(X, W.t()), bias)  # the bias in fp32, one pass
        ctx.save_for_backward(X, W)
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return y.view(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx, grad_y):
        X, W = ctx.saved_tensors
        with torch.autocast(grad_y.device.type, enabled=False):
            flat = grad_y.reshape(-1, grad_y.shape[-1])
            g = flat.to(W.dtype)
            grad_x = torch.mm(g, W).to(ctx.x_dtype).view(ctx.x_shape) if ctx.needs_input_grad[0] else None
            grad_w = torch.mm(g.t(), X).to(grad_y.dtype) if ctx.needs_input_grad[1] else None
            grad_b = flat.sum(0) if ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b, None
