"""The parts of epkit.deep_ep that need no GPU and no compiled extension: DeepEP V1's Config and
size-hint formulas, the argument checks of every call, and the torch-only layout conversions
(metadata packing, routing, scale layouts). epkit.deep_ep builds on these; the CPU tests load this
file on its own (python/tests/test_deep_ep_cpu.py), so it imports nothing from epkit at module level
except, where the package is importable, its EpkitError.

Where a formula or a table comes from DeepEP, the comment names the file of DeepEP V1 (the last V1
release, deepseek-ai/DeepEP commit 567632d, Feb 2026; the same code lives on in V2's
deep_ep/buffers/legacy.py and csrc/legacy/config.hpp). The formulas and numbers are DeepEP's; the
code is written for epkit.
"""

from typing import List, Optional, Sequence, Tuple

import torch

try:  # inside the package: the library's error type
    from ._lib import EpkitError
except ImportError:  # loaded on its own (CPU tests without a built extension)
    class EpkitError(RuntimeError):
        """Stands in for epkit.EpkitError where the extension is not built."""


# --- DeepEP V1 constants (csrc/kernels/configs.cuh, csrc/config.hpp) -------------------------------
NUM_MAX_NVL_PEERS = 8               # ranks per NVLink domain in DeepEP's normal kernels
NUM_BUFFER_ALIGNMENT_BYTES = 128    # get_low_latency_rdma_size_hint rounds to this
HINT_MAX_TOPK = 128                 # kNumMaxTopK in Config::get_*_buffer_size_hint
HINT_MAX_SCALES = 128               # kNumMaxScales, same place
SOURCE_META_BYTES = 8               # sizeof(internode::SourceMeta): two ints
TOPK_IDX_BYTES = 8                  # sizeof(topk_idx_t) with the default TOPK_IDX_BITS = 64
INT4_BYTES = 16
BF16_BYTES = 2
BF162_BYTES = 4                     # sizeof(nv_bfloat162): LowLatencyLayout's per-128-channel min/max
DEFAULT_NUM_SMS = 20                # deep_ep.Buffer.num_sms

topk_idx_t = torch.int64            # deep_ep.topk_idx_t with DeepEP's default TOPK_IDX_BITS = 64

# --- epkit's limits (src/common/config.cpp, include/epkit/types.hpp, include/epkit/layout.hpp) -----
MAX_TOPK = 16
MAX_EXPERTS = 4096
MAX_HIDDEN = 1 << 16
MAX_TOKENS_PER_RANK = 1 << 16
MAX_WORLD_SIZE = 1024
SCALE_BLOCK = 128

# --- normal mode's per-message metadata (epkit.deep_ep's own layout) -------------------------------
# Normal mode sends each token once per destination rank with 128 bytes appended to its payload
# (32 int32 words): the receiver learns the token's source and its top-k from them. Words:
META_BYTES = 128
META_WORDS = META_BYTES // 4
META_TOKEN = 0          # the token's index on its source rank
META_SRC = 1            # the source rank
META_IDX = 2            # top-k expert indices, int16 pairs (8 words hold K <= 16)
META_WEIGHTS = 10       # top-k weights, fp32 bits (16 words)
META_IDX_WORDS = (MAX_TOPK + 1) // 2
assert META_WEIGHTS >= META_IDX + META_IDX_WORDS and META_WEIGHTS + MAX_TOPK <= META_WORDS
META_MAX_EXPERT = (1 << 15) - 1  # int16 expert indices


# =================================================================================================
# Config and size hints
# =================================================================================================

def _align_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


class Config:
    """deep_ep.Config: the tuning knobs of DeepEP's normal kernels, with DeepEP's defaults and checks
    (csrc/config.hpp, struct Config, and its pybind defaults in csrc/deep_ep.cpp).

    epkit honours num_sms (it caps the blocks of the normal-mode calls, like AllToAllConfig.num_sms);
    the chunk sizes shape DeepEP's ring buffers, which epkit does not have: they are kept and checked,
    and feed the buffer-size hints only."""

    def __init__(self, num_sms: int = 20, num_max_nvl_chunked_send_tokens: int = 6,
                 num_max_nvl_chunked_recv_tokens: int = 256, num_max_rdma_chunked_send_tokens: int = 6,
                 num_max_rdma_chunked_recv_tokens: int = 256):
        ints = dict(num_sms=num_sms, num_max_nvl_chunked_send_tokens=num_max_nvl_chunked_send_tokens,
                    num_max_nvl_chunked_recv_tokens=num_max_nvl_chunked_recv_tokens,
                    num_max_rdma_chunked_send_tokens=num_max_rdma_chunked_send_tokens,
                    num_max_rdma_chunked_recv_tokens=num_max_rdma_chunked_recv_tokens)
        for name, v in ints.items():
            if isinstance(v, bool) or not isinstance(v, int):
                raise EpkitError(f"Config.{name} = {v!r} must be an int")
        if num_sms < 0:
            raise EpkitError(f"Config.num_sms = {num_sms} must be >= 0")
        if not (0 < num_max_nvl_chunked_send_tokens < num_max_nvl_chunked_recv_tokens):
            raise EpkitError(f"Config: num_max_nvl_chunked_send_tokens = {num_max_nvl_chunked_send_tokens} must be > 0 "
                             f"and below num_max_nvl_chunked_recv_tokens = {num_max_nvl_chunked_recv_tokens}")
        if num_max_rdma_chunked_send_tokens <= 0 or num_max_rdma_chunked_recv_tokens <= 0:
            raise EpkitError(f"Config: num_max_rdma_chunked_send_tokens = {num_max_rdma_chunked_send_tokens} and "
                             f"num_max_rdma_chunked_recv_tokens = {num_max_rdma_chunked_recv_tokens} must be > 0")
        # DeepEP rounds the RDMA receive chunk up to a multiple of the send chunk.
        rdma_recv = _align_up(num_max_rdma_chunked_recv_tokens, num_max_rdma_chunked_send_tokens)
        if not num_max_rdma_chunked_send_tokens < rdma_recv:
            raise EpkitError(f"Config: num_max_rdma_chunked_send_tokens = {num_max_rdma_chunked_send_tokens} must be "
                             f"below num_max_rdma_chunked_recv_tokens = {rdma_recv} (rounded up to it)")
        if not num_max_rdma_chunked_send_tokens <= rdma_recv // 2:
            raise EpkitError(f"Config: num_max_rdma_chunked_send_tokens = {num_max_rdma_chunked_send_tokens} must be "
                             f"at most half of num_max_rdma_chunked_recv_tokens = {rdma_recv}")
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = rdma_recv

    def __repr__(self):
        return (f"Config(num_sms={self.num_sms}, num_max_nvl_chunked_send_tokens={self.num_max_nvl_chunked_send_tokens}, "
                f"num_max_nvl_chunked_recv_tokens={self.num_max_nvl_chunked_recv_tokens}, "
                f"num_max_rdma_chunked_send_tokens={self.num_max_rdma_chunked_send_tokens}, "
                f"num_max_rdma_chunked_recv_tokens={self.num_max_rdma_chunked_recv_tokens})")

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """DeepEP's NVLink buffer size for this config (Config::get_nvl_buffer_size_hint, csrc/config.hpp).
        epkit allocates what it needs instead (python/README.md, "Porting from DeepEP")."""
        if not (num_ranks < NUM_MAX_NVL_PEERS or num_ranks % NUM_MAX_NVL_PEERS == 0):
            raise EpkitError(f"get_nvl_buffer_size_hint: num_ranks = {num_ranks} must be below {NUM_MAX_NVL_PEERS} "
                             f"or a multiple of it")
        if not (num_ranks <= NUM_MAX_NVL_PEERS or self.num_sms % 2 == 0):
            raise EpkitError(f"get_nvl_buffer_size_hint: num_sms = {self.num_sms} must be even above "
                             f"{NUM_MAX_NVL_PEERS} ranks")
        num_rdma_ranks = max(num_ranks // NUM_MAX_NVL_PEERS, 1)
        num_nvl_ranks = min(num_ranks, NUM_MAX_NVL_PEERS)
        channels = self.num_sms // 2
        per = channels * num_nvl_ranks
        recv = self.num_max_nvl_chunked_recv_tokens
        n = per * (2 * num_rdma_ranks + 3) * 4
        n += per * recv * hidden_bytes
        n += per * recv * SOURCE_META_BYTES
        n += per * recv * HINT_MAX_TOPK * TOPK_IDX_BYTES
        n += per * recv * HINT_MAX_TOPK * 4
        n += per * recv * HINT_MAX_SCALES * 4
        return _align_up(n, 128)

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """DeepEP's RDMA buffer size for this config (Config::get_rdma_buffer_size_hint): 0 within one
        NVLink domain."""
        if num_ranks <= NUM_MAX_NVL_PEERS:
            return 0
        if num_ranks % NUM_MAX_NVL_PEERS != 0:
            raise EpkitError(f"get_rdma_buffer_size_hint: num_ranks = {num_ranks} must be a multiple of "
                             f"{NUM_MAX_NVL_PEERS}")
        if self.num_sms % 2 != 0:
            raise EpkitError(f"get_rdma_buffer_size_hint: num_sms = {self.num_sms} must be even")
        num_rdma_ranks = num_ranks // NUM_MAX_NVL_PEERS
        channels = self.num_sms // 2
        per = channels * num_rdma_ranks
        recv = self.num_max_rdma_chunked_recv_tokens
        n = per * (NUM_MAX_NVL_PEERS * 2 + 2) * 2 * 4
        n += per * recv * hidden_bytes * 2
        n += per * recv * SOURCE_META_BYTES * 2
        n += per * recv * HINT_MAX_TOPK * TOPK_IDX_BYTES * 2
        n += per * recv * HINT_MAX_TOPK * 4 * 2
        n += per * recv * HINT_MAX_SCALES * 4 * 2
        n += per * recv * INT4_BYTES * 2
        return _align_up(n, 128)


# The recommended configs of DeepEP V1 (deep_ep/buffer.py, Buffer.get_dispatch_config and
# get_combine_config): num_ranks -> the four chunk sizes; num_sms is Buffer.num_sms at call time.
DISPATCH_CONFIGS = {
    2: (24, 256, 6, 128), 4: (6, 256, 6, 128), 8: (6, 256, 6, 128), 16: (36, 288, 20, 128),
    24: (32, 288, 8, 128), 32: (32, 288, 8, 128), 48: (32, 288, 8, 128), 64: (32, 288, 8, 128),
    96: (20, 480, 12, 128), 128: (20, 560, 12, 128), 144: (32, 720, 12, 128), 160: (28, 720, 12, 128),
}
COMBINE_CONFIGS = {
    2: (10, 256, 6, 128), 4: (9, 256, 6, 128), 8: (4, 256, 6, 128), 16: (4, 288, 12, 128),
    24: (1, 288, 8, 128), 32: (1, 288, 8, 128), 48: (1, 288, 8, 128), 64: (1, 288, 8, 128),
    96: (1, 480, 8, 128), 128: (1, 560, 8, 128), 144: (2, 720, 8, 128), 160: (2, 720, 8, 128),
}


def recommended_config(table: dict, num_ranks: int, num_sms: int, what: str) -> Config:
    if num_ranks not in table:
        raise EpkitError(f"{what}: unsupported number of EP ranks {num_ranks} (DeepEP's table has "
                         f"{sorted(table)})")
    return Config(num_sms, *table[num_ranks])


def low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                               num_experts: int) -> int:
    """DeepEP's low-latency RDMA buffer size (csrc/config.hpp: LowLatencyLayout's total_bytes, then
    get_low_latency_rdma_size_hint's rounding, which adds one alignment unit even to an aligned size).
    Two buffers (odd/even), each with send, receive and signalling regions sized for every expert."""
    M, H, E = num_max_dispatch_tokens_per_rank, hidden, num_experts
    num_scales = H // 128
    if num_scales * 4 > H:
        raise EpkitError(f"get_low_latency_rdma_size_hint: hidden = {H} is too small for its scales")
    dispatch_msg = INT4_BYTES + max(H * BF16_BYTES, H + num_scales * 4)
    combine_msg = num_scales * BF162_BYTES + H * BF16_BYTES
    send = max(M * dispatch_msg, E * M * combine_msg)
    recv = max(E * M * dispatch_msg, E * M * combine_msg)
    signal = _align_up(E * 4, 128)
    total = 2 * send + 2 * recv + 2 * signal
    return (total + NUM_BUFFER_ALIGNMENT_BYTES) // NUM_BUFFER_ALIGNMENT_BYTES * NUM_BUFFER_ALIGNMENT_BYTES


# =================================================================================================
# Argument checks. Each raises EpkitError naming the argument, the value and the limit; they read
# tensor metadata only (no device data, no synchronisation).
# =================================================================================================

def _name(t) -> str:
    return "None" if t is None else f"{tuple(t.shape)} {t.dtype}"


def require_tensor(t, what: str, dtype=None, ndim: Optional[int] = None, contiguous: bool = False):
    if not isinstance(t, torch.Tensor):
        raise EpkitError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        dtypes = dtype if isinstance(dtype, (tuple, list)) else (dtype,)
        if t.dtype not in dtypes:
            names = " or ".join(str(d) for d in dtypes)
            raise EpkitError(f"{what} has dtype {t.dtype}; DeepEP's API takes {names} here")
    if ndim is not None and t.dim() != ndim:
        raise EpkitError(f"{what} has shape {tuple(t.shape)} ({t.dim()} dims); expected {ndim} dims")
    if contiguous and not t.is_contiguous():
        raise EpkitError(f"{what} with shape {tuple(t.shape)} and strides {t.stride()} must be contiguous")
    return t


def check_num_experts(num_experts: int, num_ranks: int, what: str = "num_experts") -> int:
    if isinstance(num_experts, bool) or not isinstance(num_experts, int):
        raise EpkitError(f"{what} = {num_experts!r} must be an int")
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise EpkitError(f"{what} = {num_experts} must be in [1, {MAX_EXPERTS}]")
    if num_experts % num_ranks != 0:
        raise EpkitError(f"{what} = {num_experts} must be a multiple of the number of ranks = {num_ranks}")
    return num_experts


def check_topk_idx(topk_idx, rows: int, num_experts: int, what: str = "topk_idx") -> int:
    """topk_idx [rows, K] topk_idx_t (int64), contiguous, 1 <= K <= min(16, num_experts). Returns K."""
    require_tensor(topk_idx, what, topk_idx_t, 2, contiguous=True)
    if topk_idx.shape[0] != rows:
        raise EpkitError(f"{what} has {topk_idx.shape[0]} rows but x has {rows}")
    k = topk_idx.shape[1]
    if not 1 <= k <= MAX_TOPK:
        raise EpkitError(f"{what} has top-k = {k}; epkit takes 1 to {MAX_TOPK}")
    if k > num_experts:
        raise EpkitError(f"{what} has top-k = {k}, more than num_experts = {num_experts}")
    return k


def check_expert_range(max_index: int, num_experts: int, what: str = "topk_idx") -> None:
    """The result of a host-side reduction: the largest expert index must be below num_experts
    (negative entries mean "no expert")."""
    if max_index >= num_experts:
        raise EpkitError(f"{what} holds expert index {max_index}, but num_experts = {num_experts} "
                         f"(indices must be < {num_experts}; -1 means no expert)")


def check_low_latency_dispatch(x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, num_ranks,
                               cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                               use_fp8=True, round_scale=False, use_ue8m0=False, async_finish=False,
                               return_recv_hook=False) -> Tuple[int, int, int]:
    """DeepEP's checks of Buffer.low_latency_dispatch (csrc/deep_ep.cpp) with epkit's limits.
    Returns (num_tokens, hidden, top-k)."""
    M = num_max_dispatch_tokens_per_rank
    if isinstance(M, bool) or not isinstance(M, int):
        raise EpkitError(f"num_max_dispatch_tokens_per_rank = {M!r} must be an int")
    if not 1 <= M <= MAX_TOKENS_PER_RANK:
        raise EpkitError(f"num_max_dispatch_tokens_per_rank = {M} must be in [1, {MAX_TOKENS_PER_RANK}]")
    E = check_num_experts(num_experts, num_ranks)
    require_tensor(x, "x", torch.bfloat16, 2, contiguous=True)
    m, h = x.shape
    if h % SCALE_BLOCK != 0 or not SCALE_BLOCK <= h <= MAX_HIDDEN:
        raise EpkitError(f"x has hidden = {h}; low-latency mode takes a multiple of {SCALE_BLOCK} in "
                         f"[{SCALE_BLOCK}, {MAX_HIDDEN}]")
    if m > M:
        raise EpkitError(f"x has {m} tokens, more than num_max_dispatch_tokens_per_rank = {M}")
    k = check_topk_idx(topk_idx, m, E)
    if use_ue8m0 and not round_scale:
        raise EpkitError("use_ue8m0=True needs round_scale=True (UE8M0 scales are powers of two)")
    if use_ue8m0 and not use_fp8:
        raise EpkitError("use_ue8m0=True needs use_fp8=True")
    if async_finish and return_recv_hook:
        raise EpkitError("async_finish=True and return_recv_hook=True exclude each other (as in DeepEP)")
    if cumulative_local_expert_recv_stats is not None:
        s = require_tensor(cumulative_local_expert_recv_stats, "cumulative_local_expert_recv_stats", torch.int32, 1,
                           contiguous=True)
        if s.shape[0] != E // num_ranks:
            raise EpkitError(f"cumulative_local_expert_recv_stats has {s.shape[0]} entries; it needs one per local "
                             f"expert = {E // num_ranks}")
    if dispatch_wait_recv_cost_stats is not None:
        raise EpkitError("dispatch_wait_recv_cost_stats is not supported: epkit does not time its waits per source "
                         "rank (every wait is bounded and a timeout names the peer instead); pass None")
    return m, h, k


def check_low_latency_combine(x, topk_idx, topk_weights, num_local_experts, num_ranks, num_max, hidden,
                              dispatch_tokens, dispatch_topk, out=None, use_logfmt=False, async_finish=False,
                              return_recv_hook=False, combine_wait_recv_cost_stats=None) -> int:
    """DeepEP's checks of Buffer.low_latency_combine against the handle's dispatch. Returns num_tokens."""
    require_tensor(x, "x", torch.bfloat16, 3, contiguous=True)
    want = (num_local_experts, num_ranks * num_max, hidden)
    if tuple(x.shape) != want:
        raise EpkitError(f"x has shape {tuple(x.shape)}; the handle's dispatch needs [num_local_experts, "
                         f"num_ranks * num_max_dispatch_tokens_per_rank, hidden] = {list(want)}")
    require_tensor(topk_idx, "topk_idx", topk_idx_t, 2, contiguous=True)
    require_tensor(topk_weights, "topk_weights", torch.float32, 2, contiguous=True)
    if tuple(topk_weights.shape) != tuple(topk_idx.shape):
        raise EpkitError(f"topk_weights has shape {tuple(topk_weights.shape)} but topk_idx {tuple(topk_idx.shape)}")
    m, k = topk_idx.shape
    if m > num_max:
        raise EpkitError(f"topk_idx has {m} tokens, more than num_max_dispatch_tokens_per_rank = {num_max}")
    if m != dispatch_tokens or k != dispatch_topk:
        raise EpkitError(f"topk_idx has shape {tuple(topk_idx.shape)} but the handle's dispatch had "
                         f"[{dispatch_tokens}, {dispatch_topk}]: combine takes the dispatch's topk_idx")
    if out is not None:
        require_tensor(out, "out", torch.bfloat16, 2, contiguous=True)
        if tuple(out.shape) != (m, hidden):
            raise EpkitError(f"out has shape {tuple(out.shape)}; expected [{m}, {hidden}]")
    if use_logfmt:
        raise EpkitError("use_logfmt=True is not supported: epkit's combine sends bf16 partials (more exact than "
                         "LogFMT's 10 bits); pass use_logfmt=False")
    if async_finish and return_recv_hook:
        raise EpkitError("async_finish=True and return_recv_hook=True exclude each other (as in DeepEP)")
    if combine_wait_recv_cost_stats is not None:
        raise EpkitError("combine_wait_recv_cost_stats is not supported: epkit does not time its waits per source "
                         "rank; pass None")
    return m


# SGLang's single-batch-overlap arguments of low_latency_combine (a DeepEP fork's API).
SBO_ARGUMENTS = ("overlap", "packed_recv_count", "comp_signal", "block_m", "threshold", "num_sms", "src_signals",
                 "src_signal_expect_value")


def check_sbo_arguments(kwargs: dict) -> None:
    unknown = sorted(set(kwargs) - set(SBO_ARGUMENTS))
    if unknown:
        raise TypeError(f"low_latency_combine() got unexpected keyword arguments {unknown}")
    if kwargs.get("overlap"):
        raise EpkitError("overlap=True (single-batch overlap, a DeepEP fork's combine argument) is not supported: "
                         "epkit's combine has no signal-driven partial send; use return_recv_hook for overlap")


def check_stream_flags(previous_event, async_finish: bool, allocate_on_comm_stream: bool) -> None:
    if allocate_on_comm_stream and not (previous_event is not None and async_finish):
        raise EpkitError("allocate_on_comm_stream=True needs previous_event and async_finish=True (as in DeepEP)")


def check_dispatch_layout(topk_idx, num_experts: int, num_ranks: int) -> Tuple[int, int]:
    require_tensor(topk_idx, "topk_idx", topk_idx_t, 2, contiguous=True)
    E = check_num_experts(num_experts, num_ranks)
    return topk_idx.shape[0], E


def split_x(x) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """x of normal dispatch: a bf16 tensor, or (fp8 e4m3 tensor, scales)."""
    if isinstance(x, tuple):
        if len(x) != 2:
            raise EpkitError(f"x as a tuple must be (x_fp8, x_scales), got {len(x)} elements")
        return x[0], x[1]
    return x, None


def check_normal_x(x, x_scales) -> Tuple[int, int]:
    """Normal-mode x: bf16 [m, H], or fp8 e4m3 [m, H] with scales [m, S] (fp32, or int32 packed UE8M0;
    any strides). H a multiple of 16. Returns (m, H)."""
    if x_scales is None:
        require_tensor(x, "x", torch.bfloat16, 2, contiguous=True)
    else:
        require_tensor(x, "x[0]", torch.float8_e4m3fn, 2, contiguous=True)
        require_tensor(x_scales, "x[1] (scales)", (torch.float32, torch.int32), 2)
        if x_scales.shape[0] != x.shape[0]:
            raise EpkitError(f"x[1] (scales) has {x_scales.shape[0]} rows but x[0] has {x.shape[0]}")
    m, h = x.shape
    if h % 16 != 0 or not 16 <= h <= MAX_HIDDEN - META_BYTES:
        raise EpkitError(f"x has hidden = {h}; normal mode takes a multiple of 16 in [16, {MAX_HIDDEN - META_BYTES}]")
    if x_scales is not None:
        s = x_scales.shape[1]
        room = normal_scale_columns(h)
        if not 1 <= s <= room:
            raise EpkitError(f"x[1] (scales) has {s} columns; epkit carries 1 to {room} per token at hidden = {h} "
                             f"(one fp32 per 128 elements, or packed UE8M0)")
    if m > MAX_TOKENS_PER_RANK:
        raise EpkitError(f"x has {m} tokens, more than epkit's {MAX_TOKENS_PER_RANK} per rank")
    return m, h


def check_normal_dispatch(x, x_scales, handle_given: bool, num_tokens_per_rank, is_token_in_rank,
                          num_tokens_per_expert, topk_idx, topk_weights, expert_alignment: int,
                          num_worst_tokens: int, num_ranks: int) -> Tuple[int, int, int, int]:
    """DeepEP's checks of Buffer.dispatch (intranode_dispatch, csrc/deep_ep.cpp) with epkit's limits.
    Returns (num_tokens, hidden, num_experts or 0 (cached), top-k or 0)."""
    m, h = check_normal_x(x, x_scales)
    if isinstance(expert_alignment, bool) or not isinstance(expert_alignment, int) or expert_alignment < 1:
        raise EpkitError(f"expert_alignment = {expert_alignment!r} must be an int >= 1")
    if isinstance(num_worst_tokens, bool) or not isinstance(num_worst_tokens, int) or num_worst_tokens < 0:
        raise EpkitError(f"num_worst_tokens = {num_worst_tokens!r} must be an int >= 0")
    if handle_given:
        if topk_idx is not None or topk_weights is not None:
            raise EpkitError("a cached dispatch (handle given) takes no topk_idx or topk_weights (as in DeepEP)")
        return m, h, 0, 0
    if num_tokens_per_rank is None or is_token_in_rank is None or num_tokens_per_expert is None:
        missing = [n for n, v in (("num_tokens_per_rank", num_tokens_per_rank), ("is_token_in_rank", is_token_in_rank),
                                  ("num_tokens_per_expert", num_tokens_per_expert)) if v is None]
        raise EpkitError(f"dispatch without a handle needs {', '.join(missing)} (from get_dispatch_layout)")
    require_tensor(is_token_in_rank, "is_token_in_rank", torch.bool, 2, contiguous=True)
    if tuple(is_token_in_rank.shape) != (m, num_ranks):
        raise EpkitError(f"is_token_in_rank has shape {tuple(is_token_in_rank.shape)}; expected [{m}, {num_ranks}]")
    require_tensor(num_tokens_per_rank, "num_tokens_per_rank", torch.int32, 1, contiguous=True)
    if num_tokens_per_rank.shape[0] != num_ranks:
        raise EpkitError(f"num_tokens_per_rank has {num_tokens_per_rank.shape[0]} entries; expected {num_ranks}")
    require_tensor(num_tokens_per_expert, "num_tokens_per_expert", torch.int32, 1, contiguous=True)
    E = check_num_experts(num_tokens_per_expert.shape[0], num_ranks, "num_tokens_per_expert's length (num_experts)")
    if E - 1 > META_MAX_EXPERT:
        raise EpkitError(f"num_experts = {E} exceeds {META_MAX_EXPERT + 1}")
    if (topk_idx is None) != (topk_weights is None):
        raise EpkitError("topk_idx and topk_weights go together: pass both or neither (as in DeepEP)")
    k = 0
    if topk_idx is not None:
        k = check_topk_idx(topk_idx, m, E)
        require_tensor(topk_weights, "topk_weights", torch.float32, 2, contiguous=True)
        if tuple(topk_weights.shape) != tuple(topk_idx.shape):
            raise EpkitError(f"topk_weights has shape {tuple(topk_weights.shape)} but topk_idx {tuple(topk_idx.shape)}")
    if num_worst_tokens > 0 and topk_idx is None:
        raise EpkitError("num_worst_tokens > 0 needs topk_idx and topk_weights (as in DeepEP)")
    return m, h, E, k


def check_normal_combine(x, rows: int, hidden: int, topk_weights, bias) -> int:
    """Buffer.combine's x [rows of the handle's dispatch, hidden] bf16. Returns the top-k of
    topk_weights, or 0."""
    require_tensor(x, "x", torch.bfloat16, 2, contiguous=True)
    if tuple(x.shape) != (rows, hidden):
        raise EpkitError(f"x has shape {tuple(x.shape)}; the handle's dispatch received [{rows}, {hidden}]")
    if bias is not None:
        raise EpkitError("bias is not supported: epkit's combine cannot add it before its single rounding, and adding "
                         "it afterwards would round twice; add it to the result yourself")
    k = 0
    if topk_weights is not None:
        require_tensor(topk_weights, "topk_weights", torch.float32, 2, contiguous=True)
        if topk_weights.shape[0] != rows:
            raise EpkitError(f"topk_weights has {topk_weights.shape[0]} rows; x has {rows}")
        k = topk_weights.shape[1]
        if not 1 <= k <= MAX_TOPK:
            raise EpkitError(f"topk_weights has top-k = {k}; epkit takes 1 to {MAX_TOPK}")
    return k


# =================================================================================================
# Sizes and layouts of normal mode (one message per (token, destination rank), metadata appended)
# =================================================================================================

def meta_elems(dtype: torch.dtype) -> int:
    """Payload elements of the appended metadata (128 bytes)."""
    return META_BYTES // torch.empty((), dtype=dtype).element_size()


def normal_hidden(hidden: int, dtype: torch.dtype) -> int:
    """Hidden size of the AllToAll that carries normal mode's messages: the payload plus the metadata."""
    return hidden + meta_elems(dtype)


def normal_scale_columns(hidden: int) -> int:
    """fp32 scale words each fp8 message carries: one per 128 elements of the widened payload."""
    return (hidden + META_BYTES + SCALE_BLOCK - 1) // SCALE_BLOCK


def normal_route_width(num_ranks: int) -> int:
    """Top-k of the rank-level AllToAll (one "expert" per rank): a token goes to at most this many."""
    return min(num_ranks, MAX_TOPK)


def pow2_at_least(n: int, floor: int = 128) -> int:
    n = max(int(n), floor)
    return 1 << (n - 1).bit_length()


def normal_max_tokens(current: int, needed: int) -> int:
    """The bound M of normal mode's objects: grows in powers of two, never shrinks."""
    m = max(current, pow2_at_least(needed))
    if m > MAX_TOKENS_PER_RANK:
        raise EpkitError(f"normal mode needs {needed} tokens per rank, more than epkit's {MAX_TOKENS_PER_RANK}")
    return m


def routing_from_rank_mask(is_token_in_rank: torch.Tensor) -> torch.Tensor:
    """The rank-level routing of normal mode: [m, min(W, 16)] int32, the destination ranks of each token
    in ascending order, -1 after them. With W <= 16 entry r is r or -1 (no sort)."""
    m, W = is_token_in_rank.shape
    ranks = torch.arange(W, dtype=torch.int32, device=is_token_in_rank.device)
    if W <= MAX_TOPK:
        return torch.where(is_token_in_rank, ranks, torch.full_like(ranks, -1))
    # Destinations first, in rank order (a stable sort of "not in rank"), then -1.
    order = torch.sort((~is_token_in_rank).to(torch.int8), dim=1, stable=True).indices[:, :MAX_TOPK]
    hit = torch.gather(is_token_in_rank, 1, order)
    return torch.where(hit, order.to(torch.int32), torch.full_like(order, -1, dtype=torch.int32))


def meta_template(max_tokens: int, rank: int, device) -> torch.Tensor:
    """[M, 32] int32: word 0 the token index, word 1 this rank, the rest zero."""
    t = torch.zeros((max_tokens, META_WORDS), dtype=torch.int32, device=device)
    t[:, META_TOKEN] = torch.arange(max_tokens, dtype=torch.int32, device=device)
    t[:, META_SRC] = rank
    return t


def pack_meta(template: torch.Tensor, m: int, topk_idx: Optional[torch.Tensor],
              topk_weights: Optional[torch.Tensor]) -> torch.Tensor:
    """The 32 metadata words of each of the m tokens: the template's token and rank words, then the top-k
    (int16 pairs) and weights (fp32 bits). Without top-k the template rows are used as they are."""
    base = template[:m]
    if topk_idx is None:
        return base
    k = topk_idx.shape[1]
    idx16 = topk_idx.to(torch.int16)
    if k % 2:
        idx16 = torch.cat([idx16, torch.full((m, 1), -1, dtype=torch.int16, device=idx16.device)], dim=1)
    parts = [base[:, :META_IDX], idx16.view(torch.int32)]
    used = META_IDX + idx16.shape[1] // 2
    if used < META_WEIGHTS:
        parts.append(base[:, used:META_WEIGHTS])
    parts.append(topk_weights.view(torch.int32))
    end = META_WEIGHTS + k
    if end < META_WORDS:
        parts.append(base[:, end:])
    return torch.cat(parts, dim=1)


def append_meta(x: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """x [m, H] (bf16 or fp8) with the metadata's 128 bytes appended to each row: [m, H + 128 / elem]."""
    wide = torch.cat([x.view(torch.uint8), meta.view(torch.uint8)], dim=1)
    return wide.view(x.dtype)


def widen_scales(x_scales: torch.Tensor, columns: int) -> torch.Tensor:
    """The caller's scales [m, S] (fp32 or int32, any strides) as the fp32 words [m, columns] epkit
    carries, zero-padded: the bytes are carried as they are."""
    s = x_scales if x_scales.dtype == torch.float32 else x_scales.view(torch.float32)
    m, n = s.shape
    if n == columns:
        return s.contiguous()
    return torch.cat([s, torch.zeros((m, columns - n), dtype=torch.float32, device=s.device)], dim=1)


def unpack_meta(meta_rows: torch.Tensor, topk: int):
    """From received metadata rows [R, 32] int32: (token [R] int32, source [R] int32, expert indices
    [R, K] int64, weights [R, K] fp32). K = 0 gives None for the last two."""
    token, src = meta_rows[:, META_TOKEN], meta_rows[:, META_SRC]
    if topk == 0:
        return token, src, None, None
    words = (topk + 1) // 2
    idx = meta_rows[:, META_IDX:META_IDX + words].contiguous().view(torch.int16)[:, :topk].to(torch.int64)
    w = meta_rows[:, META_WEIGHTS:META_WEIGHTS + topk].contiguous().view(torch.float32)
    return token, src, idx, w


def remap_topk(idx: torch.Tensor, weights: torch.Tensor, valid_rows: torch.Tensor, rank: int,
               num_local_experts: int):
    """DeepEP's received top-k (intranode.cu, dispatch): an expert of this rank becomes its local index,
    every other entry -1 with weight 0; rows that are not valid get -1 and 0 throughout."""
    local = idx - rank * num_local_experts
    ok = valid_rows[:, None] & (idx >= 0) & (local >= 0) & (local < num_local_experts)
    return (torch.where(ok, local, torch.full_like(local, -1)),
            torch.where(ok, weights, torch.zeros_like(weights)), ok)


def local_expert_counts(recv_idx: torch.Tensor, num_local_experts: int) -> torch.Tensor:
    """Received (token, k) entries per local expert, [L] int64, from remapped indices (-1: none)."""
    flat = recv_idx.reshape(-1)
    slot = torch.where(flat >= 0, flat, torch.full_like(flat, num_local_experts))
    counts = torch.zeros(num_local_experts + 1, dtype=torch.int64, device=recv_idx.device)
    counts.scatter_add_(0, slot, torch.ones_like(slot))
    return counts[:num_local_experts]


def align_counts(counts: Sequence[int], alignment: int) -> List[int]:
    """num_recv_tokens_per_expert_list: each count rounded up to expert_alignment."""
    return [(int(c) + alignment - 1) // alignment * alignment for c in counts]


def dispatch_layout(topk_idx: torch.Tensor, num_experts: int, num_ranks: int):
    """Buffer.get_dispatch_layout's four outputs from topk_idx [m, K] (negative: no expert):
    num_tokens_per_rank [W] int32, num_tokens_per_rdma_rank [W / 8] int32 (None within one NVLink
    domain of 8), num_tokens_per_expert [E] int32, is_token_in_rank [m, W] bool. A token counts once
    per rank however many of its experts live there, once per expert entry for the experts."""
    m = topk_idx.shape[0]
    dev = topk_idx.device
    L = num_experts // num_ranks
    valid = (topk_idx >= 0) & (topk_idx < num_experts)
    flat = torch.where(valid, topk_idx, torch.full_like(topk_idx, num_experts)).reshape(-1)
    per_expert = torch.zeros(num_experts + 1, dtype=torch.int32, device=dev)
    per_expert.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    rank_of = torch.where(valid, topk_idx // L, torch.full_like(topk_idx, num_ranks))
    in_rank = torch.zeros((m, num_ranks + 1), dtype=torch.bool, device=dev)
    in_rank.scatter_(1, rank_of, True)
    in_rank = in_rank[:, :num_ranks].contiguous()
    per_rank = in_rank.sum(dim=0, dtype=torch.int32)
    per_rdma = None
    if num_ranks > NUM_MAX_NVL_PEERS and num_ranks % NUM_MAX_NVL_PEERS == 0:
        per_rdma = in_rank.view(m, num_ranks // NUM_MAX_NVL_PEERS, NUM_MAX_NVL_PEERS).any(dim=2).sum(
            dim=0, dtype=torch.int32)
    return per_rank, per_rdma, per_expert[:num_experts], in_rank


def gather_rows(src: torch.Tensor, sel: torch.Tensor, rows: int, fill=None) -> torch.Tensor:
    """src rows sel (a permutation prefix) as a new contiguous [rows, ...] tensor; rows past len(sel)
    (num_worst_tokens above the rows that can arrive) are `fill`, or left uninitialised."""
    n = sel.shape[0]
    raw = as_int_view(src)  # gathers move bits: fp8 has few kernels of its own
    out = torch.empty((rows,) + tuple(src.shape[1:]), dtype=src.dtype, device=src.device)
    torch.index_select(raw, 0, sel, out=as_int_view(out)[:n])
    if rows > n and fill is not None:
        out[n:] = fill
    return out


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_int_view(t: torch.Tensor) -> torch.Tensor:
    """t's bits as the integer type of its element size (a view)."""
    return t if not t.is_floating_point() else t.view(_INT_OF_SIZE[t.element_size()])


def rank_prefix_matrix(src: torch.Tensor, valid: torch.Tensor, num_ranks: int, rank: int) -> torch.Tensor:
    """[W, W] int32: column `rank` holds, at row i, the tokens this rank received from ranks 0..i (DeepEP's
    rank_prefix_matrix[i][rank]); the other columns, which only their ranks know, are -1."""
    s = torch.where(valid, src.to(torch.int64), torch.zeros_like(src, dtype=torch.int64))
    counts = torch.zeros(num_ranks, dtype=torch.int32, device=src.device)
    counts.scatter_add_(0, s, valid.to(torch.int32))
    out = torch.full((num_ranks, num_ranks), -1, dtype=torch.int32, device=src.device)
    out[:, rank] = torch.cumsum(counts, 0, dtype=torch.int32)
    return out


# =================================================================================================
# Low-latency scales in DeepEP's layout
# =================================================================================================

def empty_deepep_scales(L: int, N: int, S: int, ue8m0: bool, device) -> torch.Tensor:
    """DeepEP's low-latency scale tensor (csrc/deep_ep.cpp, low_latency_dispatch): [L, N, S] fp32, or
    with ue8m0 [L, N, ceil(S / 4)] int32, each a transposed view of [L, S (or packs), N] storage, so
    that every expert's scales are column-major (TMA-friendly, what DeepGEMM reads). The fp32 one's
    storage is what dispatch writes with AllToAllConfig.expert_scales_mn_major."""
    cols = (S + 3) // 4 if ue8m0 else S
    dtype = torch.int32 if ue8m0 else torch.float32
    return torch.empty((L, cols, N), dtype=dtype, device=device).transpose(1, 2)


def pack_ue8m0_scales(out: torch.Tensor, expert_x_scale: torch.Tensor) -> torch.Tensor:
    """epkit's scale rows [L, N, S] fp32 (row-major, powers of two) into DeepEP's UE8M0 layout `out`
    (empty_deepep_scales(..., ue8m0=True)): each scale's exponent byte, four packed little-endian into
    an int32: word p of a row holds scales 4p .. 4p + 3 (internode_ll.cu, dispatch's receive)."""
    L, N, S = expert_x_scale.shape
    packs = out.shape[2]
    exp = torch.bitwise_and(torch.bitwise_right_shift(expert_x_scale.view(torch.int32), 23), 0xFF).to(torch.uint8)
    if packs * 4 != S:
        exp = torch.cat([exp, torch.zeros((L, N, packs * 4 - S), dtype=torch.uint8, device=exp.device)], dim=2)
    out.copy_(exp.contiguous().view(torch.int32))
    return out


def unpack_ue8m0(packed: torch.Tensor, num_scales: int) -> torch.Tensor:
    """The fp32 powers of two that packed UE8M0 words [..., P] int32 hold: [..., num_scales]."""
    dense = torch.empty(packed.shape, dtype=packed.dtype, device=packed.device).copy_(packed)  # standard strides
    b = dense.view(torch.uint8)[..., :num_scales].to(torch.int32)
    return torch.bitwise_left_shift(b, 23).view(torch.float32)


# =================================================================================================
# Exact fp32 transport through bf16 sums (normal combine's combined_topk_weights)
# =================================================================================================

def split_fp32(w: torch.Tensor) -> torch.Tensor:
    """w fp32 as three bf16 values whose fp32 sum (p0 + p1) + p2 is w exactly (each piece takes the next
    8 significant bits, rounded); non-finite values go whole into p0. [..., 3] bf16."""
    p0 = w.to(torch.bfloat16)
    r1 = w - p0.float()
    p1 = r1.to(torch.bfloat16)
    r2 = r1 - p1.float()
    p2 = r2.to(torch.bfloat16)
    ok = torch.isfinite(w) & torch.isfinite(p0)
    zero = torch.zeros_like(p0)
    return torch.stack([torch.where(ok, p0, w.to(torch.bfloat16)), torch.where(ok, p1, zero),
                        torch.where(ok, p2, zero)], dim=-1)


def join_fp32(pieces: torch.Tensor) -> torch.Tensor:
    """Inverse of split_fp32: (p0 + p1) + p2 in fp32."""
    f = pieces.float()
    whole = (f[..., 0] + f[..., 1]) + f[..., 2]
    return torch.where((f[..., 1] == 0) & (f[..., 2] == 0), f[..., 0], whole)  # keeps -0.0


def weights_hidden(num_ranks: int, topk: int) -> int:
    """Hidden (bf16 elements) of the object that carries combine's topk_weights back: two int32 words
    of source metadata, then 3 bf16 pieces per (rank slot, k), rounded up to 16 elements."""
    return _align_up(4 + 3 * num_ranks * topk, 16)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
