"""dispatch and combine as torch custom ops, for torch.compile.

Dynamo cannot trace into the extension, so a compiled function that calls it directly breaks its
graph there. Registered as custom ops (torch.library.custom_op) with the outputs declared as
mutated arguments, the calls stay in the graph (fullgraph=True works) and keep their order through
those outputs. They are used only while Dynamo traces (compiling()); eager calls go straight to the
extension. An AllToAll object reaches the op as an integer id, since ops take no Python objects.

Where this torch cannot register them, or with EPKIT_TORCH_OPS=0 (or use_ops = False before
compiling), the calls are marked not_traced instead: compiled code then breaks its graph at each
call and runs the call eagerly.
"""

import itertools
import os
import weakref
from typing import Optional

import torch

from ._lib import EpkitError

_objects: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_ids = itertools.count(1)

# torch.compiler.disable where it exists: Dynamo runs the function eagerly instead of tracing it.
not_traced = getattr(getattr(torch, "compiler", None), "disable", None) or (lambda fn: fn)


def register(obj) -> int:
    """A process-unique id for obj, valid while obj lives."""
    i = next(_ids)
    _objects[i] = obj
    return i


def _get(i: int):
    obj = _objects.get(i)
    if obj is None:
        raise EpkitError(f"epkit op called for AllToAll #{i}, which no longer exists")
    return obj


def tracing() -> bool:
    """True while Dynamo traces (torch.compile)."""
    return _is_compiling()


def _is_compiling() -> bool:
    c = getattr(torch, "compiler", None)
    if c is not None and hasattr(c, "is_compiling"):
        return c.is_compiling()
    return torch._dynamo.is_compiling()


def _define():
    lib_op = torch.library.custom_op

    # No argument may be called `mode`: auto_functionalized (what inductor wraps mutating ops in)
    # takes a keyword of that name, and fullgraph compilation then fails with "got multiple values
    # for argument 'mode'" (seen with torch 2.11). `halves` is 0 (both), 1 (send) or 2 (recv).
    @lib_op("epkit::dispatch", mutates_args=("expert_x", "expert_x_scale", "expert_num_tokens", "expert_offsets"))
    def dispatch_op(handle: int, halves: int, x: Optional[torch.Tensor], x_scale: Optional[torch.Tensor],
                    topk_idx: torch.Tensor, num_tokens: int, num_tokens_device: Optional[torch.Tensor],
                    expert_x: torch.Tensor, expert_x_scale: Optional[torch.Tensor], expert_num_tokens: torch.Tensor,
                    expert_offsets: Optional[torch.Tensor], topk_weights: Optional[torch.Tensor]) -> None:
        _get(handle)._dispatch_now(halves, x, x_scale, topk_idx, num_tokens, num_tokens_device, expert_x,
                                   expert_x_scale, expert_num_tokens, expert_offsets, topk_weights)

    @dispatch_op.register_fake
    def _(handle, halves, x, x_scale, topk_idx, num_tokens, num_tokens_device, expert_x, expert_x_scale,
          expert_num_tokens, expert_offsets, topk_weights):
        return None

    @lib_op("epkit::combine", mutates_args=("out",))
    def combine_op(handle: int, halves: int, expert_y: Optional[torch.Tensor], topk_idx: torch.Tensor,
                   topk_weights: Optional[torch.Tensor], num_tokens: int, num_tokens_device: Optional[torch.Tensor],
                   out: torch.Tensor) -> None:
        _get(handle)._combine_now(halves, expert_y, topk_idx, topk_weights, num_tokens, num_tokens_device, out)

    @combine_op.register_fake
    def _(handle, halves, expert_y, topk_idx, topk_weights, num_tokens, num_tokens_device, out):
        return None

    # The registered overloads: what Dynamo records in the graph.
    return torch.ops.epkit.dispatch.default, torch.ops.epkit.combine.default


try:
    dispatch, combine = _define()
    UNAVAILABLE = ""
except Exception as e:  # noqa: BLE001 - any failure means: fall back to graph breaks
    dispatch = combine = None
    UNAVAILABLE = f"{type(e).__name__}: {e}"


# Whether compiled code calls the custom ops (True) or breaks its graph at each call (False).
use_ops = os.environ.get("EPKIT_TORCH_OPS", "1") != "0"


def compiling() -> bool:
    """True while Dynamo traces and the custom ops are in use: calls should go through them."""
    return use_ops and dispatch is not None and _is_compiling()
