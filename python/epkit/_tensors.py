"""torch tensors to the (DLPack capsule, epkit dtype) pairs the extension takes.

DLPack producers disagree on fp8 and unsigned 32-bit codes, so those travel as same-size views
(uint8, int32) and the real type goes beside them. Nothing is copied.
"""

import torch
from torch.utils.dlpack import to_dlpack as _to_dlpack

from ._lib import EpkitError, _C

_D = _C.DType
TORCH_TO_EPKIT = {
    torch.bfloat16: _D.bf16,
    torch.float16: _D.fp16,
    torch.float32: _D.fp32,
    torch.float8_e4m3fn: _D.fp8_e4m3,
    torch.int32: _D.int32,
    torch.int64: _D.int64,
    torch.uint32: _D.uint32,
    torch.uint8: _D.uint8,
}
EPKIT_TO_TORCH = {int(v): k for k, v in TORCH_TO_EPKIT.items()}
_NAMES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn,
}
_VIEW_AS = {torch.float8_e4m3fn: torch.uint8, torch.uint32: torch.int32}


def to_torch_dtype(dtype):
    """A torch dtype from a torch dtype, an epkit DType or a name such as "bf16" or "fp8_e4m3"."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, _C.DType):
        return EPKIT_TO_TORCH[int(dtype)]
    if isinstance(dtype, str) and dtype.lower() in _NAMES:
        return _NAMES[dtype.lower()]
    raise EpkitError(f"unknown dtype {dtype!r}; use a torch dtype or one of {sorted(_NAMES)}")


def to_epkit_dtype(dtype):
    t = to_torch_dtype(dtype)
    if t not in TORCH_TO_EPKIT:
        raise EpkitError(f"dtype {t} is not supported by epkit ({sorted(str(k) for k in TORCH_TO_EPKIT)})")
    return TORCH_TO_EPKIT[t]


def as_tensor(obj, what):
    """A torch tensor viewing obj: a torch tensor, or any object with __dlpack__ or __cuda_array_interface__."""
    if obj is None or isinstance(obj, torch.Tensor):
        return obj
    if hasattr(obj, "__cuda_array_interface__"):
        return torch.as_tensor(obj, device="cuda")
    if hasattr(obj, "__dlpack__"):
        return torch.from_dlpack(obj)
    raise EpkitError(f"{what} must be a CUDA tensor (torch, DLPack or __cuda_array_interface__), got {type(obj).__name__}")


def arg(t, what):
    """(array, dtype code) for the extension, or None. Checks what the C++ layer cannot name well."""
    if t is None:
        return None
    t = as_tensor(t, what)
    if t.device.type != "cuda":
        raise EpkitError(f"{what} must be on a CUDA device, got {t.device}")
    code = TORCH_TO_EPKIT.get(t.dtype)
    if code is None:
        raise EpkitError(f"{what} has dtype {t.dtype}, which epkit does not take")
    view = _VIEW_AS.get(t.dtype)
    # detach: DLPack refuses tensors that require grad; the kernels never take part in autograd.
    t = t.detach()
    if view is not None:
        t = t.view(view)
    # A capsule from to_dlpack rather than the tensor itself: given a tensor, nanobind would call
    # tensor.__dlpack__(), which (stream=None) makes the legacy default stream wait on the current
    # one. That costs an event per tensor and breaks CUDA graph capture; to_dlpack touches no stream.
    return (_to_dlpack(t), int(code))
