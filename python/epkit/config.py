"""AllToAllConfig: the Python face of epkit::AllToAllConfig, with the same field names."""

from dataclasses import dataclass, fields
from typing import Optional, Union

import torch

from ._lib import EpkitError, _C
from ._tensors import to_epkit_dtype, to_torch_dtype

DTypeLike = Union[torch.dtype, str]

_PATHS = {"auto": _C.DataPath.auto, "portable": _C.DataPath.portable}
_LAYOUTS = {"masked": _C.ExpertLayout.masked, "packed": _C.ExpertLayout.packed}


def parse_enum(owner: str, field: str, value, names: dict, enum_type):
    """value as a member of enum_type: the member itself, or its name in `names`; else EpkitError."""
    if isinstance(value, enum_type):
        return value
    if value not in names:
        raise EpkitError(f"{owner}.{field} = {value!r} is not one of {sorted(names)} "
                         f"(or an epkit.{enum_type.__name__})")
    return names[value]


@dataclass
class AllToAllConfig:
    """One expert-parallel dispatch/combine instance; fields and units as in include/epkit/config.hpp.

    world_size and rank default to the NVSHMEM PE count and index, or to 1 and 0 where NVSHMEM is
    not initialized. Dtypes take torch dtypes or names
    ("bf16", "fp16", "fp32", "fp8_e4m3").
    """

    num_experts: int                    # E: routed experts, E % world_size == 0
    topk: int                           # K: top-k, 1..16
    hidden: int                         # H: elements per token, a multiple of 16
    max_tokens_per_rank: int            # M: most tokens one rank (one DP group) passes to dispatch
    world_size: Optional[int] = None    # W
    rank: Optional[int] = None
    dp_size: int = 1                    # D: ranks per DP group, holding identical tokens
    dispatch_dtype: DTypeLike = torch.bfloat16    # payload: bf16, fp16 or fp8_e4m3 (+ fp32 scales per 128)
    combine_in_dtype: DTypeLike = torch.bfloat16  # expert outputs: bf16, fp16 or fp32
    combine_out_dtype: DTypeLike = torch.bfloat16 # combined tokens: bf16 or fp16
    layout: Union[str, "_C.ExpertLayout"] = "masked"  # "masked" [E/W, capacity, H] or "packed" [R, H] + offsets
    capacity: int = 0                   # masked: slots per local expert; 0 means M * (W / D)
    packed_rows: int = 0                # packed: R; 0 means the bound that cannot overflow
    packed_row_align: int = 1           # packed: every expert's first row is a multiple of this (128 for DeepGEMM)
    path: Union[str, "_C.DataPath"] = "auto"  # "auto" (P2P loads/stores where possible) or "portable"
    num_sms: int = 0                    # 0 means all SMs
    timeout_ms: int = -1                # -1 means env EPKIT_TIMEOUT_MS, else 10000
    weights_at_dispatch: bool = False   # router weights go to dispatch (carried in each message), none to combine
    expert_scales_mn_major: bool = False  # masked fp8: expert_x_scale [E/W, ceil(H/128), capacity] (DeepGEMM's MN-major scales)

    def to_cpp(self) -> "_C.AllToAllConfig":
        c = _C.AllToAllConfig()
        # Defaults: this NVSHMEM PE, or world size 1 (no NVSHMEM needed) where NVSHMEM is not initialized.
        on_pe = _C.initialized()
        c.world_size = int(self.world_size if self.world_size is not None else (_C.n_pes() if on_pe else 1))
        c.rank = int(self.rank if self.rank is not None else (_C.my_pe() if on_pe else 0))
        c.dp_size = int(self.dp_size)
        c.num_experts = int(self.num_experts)
        c.topk = int(self.topk)
        c.hidden = int(self.hidden)
        c.max_tokens_per_rank = int(self.max_tokens_per_rank)
        c.dispatch_dtype = to_epkit_dtype(self.dispatch_dtype)
        c.combine_in_dtype = to_epkit_dtype(self.combine_in_dtype)
        c.combine_out_dtype = to_epkit_dtype(self.combine_out_dtype)
        c.layout = parse_enum("AllToAllConfig", "layout", self.layout, _LAYOUTS, _C.ExpertLayout)
        c.capacity = int(self.capacity)
        c.packed_rows = int(self.packed_rows)
        c.packed_row_align = int(self.packed_row_align)
        c.path = parse_enum("AllToAllConfig", "path", self.path, _PATHS, _C.DataPath)
        c.num_sms = int(self.num_sms)
        c.timeout_ms = int(self.timeout_ms)
        c.weights_at_dispatch = bool(self.weights_at_dispatch)
        c.expert_scales_mn_major = bool(self.expert_scales_mn_major)
        return c

    def validate(self) -> None:
        """Raises EpkitError naming the first field out of range (the C++ validate)."""
        self.to_cpp().validate()

    # Derived quantities, by the C++ formulas (one source of truth).
    @property
    def num_local_experts(self) -> int:
        return self.to_cpp().num_local_experts()

    @property
    def effective_capacity(self) -> int:
        return self.to_cpp().effective_capacity()

    @property
    def scales_per_token(self) -> int:
        return self.to_cpp().scales_per_token()

    @property
    def packed(self) -> bool:
        return self.to_cpp().layout == _C.ExpertLayout.packed

    @property
    def effective_packed_rows(self) -> int:
        """R of the packed layout: packed_rows, or the bound that cannot overflow when it is 0."""
        return self.to_cpp().effective_packed_rows()

    def torch_dtypes(self):
        """(dispatch, combine_in, combine_out) as torch dtypes."""
        return tuple(to_torch_dtype(d) for d in (self.dispatch_dtype, self.combine_in_dtype, self.combine_out_dtype))

    @classmethod
    def field_names(cls):
        return [f.name for f in fields(cls)]
