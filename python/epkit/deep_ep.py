"""epkit.deep_ep: DeepEP V1's Python API over epkit (``import epkit.deep_ep as deep_ep``).

``Buffer``, ``EventOverlap``, ``Config`` and ``topk_idx_t`` with DeepEP's names, argument orders,
defaults, return tuples, dtypes and layouts for what vLLM's deepep_low_latency /
deepep_high_throughput backends and SGLang's deepep dispatchers call (python/README.md, "Porting
from DeepEP", lists what maps, what is accepted and ignored, and what raises).

How the calls map onto epkit.AllToAll:

* Low-latency mode (decode): one AllToAll per (max tokens, hidden, experts, top-k, payload dtype),
  masked layout. Its expert_x *is* DeepEP's packed ``recv_x`` ([E/W, W * M, H]); fp8 dispatch
  quantizes with epkit.quantize (1x128 blocks) and dispatch writes the scales straight into DeepEP's
  column-major layout (AllToAllConfig.expert_scales_mn_major; packed UE8M0 with ``use_ue8m0``, from
  row-major scales); ``return_recv_hook`` is the split send/receive halves.
  Combine is epkit's weighted combine on the same object. DeepEP keeps two buffers; a Buffer keeps up
  to two AllToAll objects per configuration, so two dispatches may be in flight (vLLM's dual-batch
  overlap, SGLang's two-batch overlap).
* Normal mode (prefill): an AllToAll with one "expert" per rank, so each token goes once to each rank
  in ``is_token_in_rank`` and lands in exactly one row there. 128 bytes appended to every message
  carry the token's index, its source rank and its top-k (indices and weights); the receiver sorts
  the rows by (source rank, token), which is DeepEP's order, and remaps the top-k to local experts.
  Combine scatters x back into those rows and runs epkit's combine with weight 1 per destination, the
  per-rank sum DeepEP's normal combine computes.

Every call checks its arguments on the host before anything launches and raises epkit.EpkitError
naming the argument, its value and the limit. The expert-index range (``topk_idx < num_experts``)
needs the indices on the host: it is checked with one synchronisation per call outside CUDA graph
capture (turn off with ``Buffer(..., host_checks=False)`` or EPKIT_DEEP_EP_HOST_CHECKS=0); inside a
capture, and with the check off, epkit's kernels check the indices on the device and the next call or
``check()`` raises.
"""

import os
from typing import Callable, List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from . import _deep_ep_spec as spec
from ._deep_ep_spec import Config, topk_idx_t  # noqa: F401  (re-exported: deep_ep.Config, deep_ep.topk_idx_t)
from ._lib import EpkitError, _C
from .all_to_all import _BOTH, _RECV, _SEND, AllToAll as _AllToAll, DispatchOutput
from .config import AllToAllConfig
from .moe import quantize as _quantize
from .nvshmem import nvshmem_alloc_empty_unique_id, nvshmem_get_unique_id, nvshmem_init

__all__ = ["Buffer", "Config", "EventHandle", "EventOverlap", "topk_idx_t"]

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


class _CudaRuntime:
    """The CUDA calls this module makes, in one place (the CPU tests swap in a host model)."""

    @staticmethod
    def device() -> torch.device:
        return torch.device("cuda", _C.device())

    @staticmethod
    def current_device() -> int:
        return torch.cuda.current_device()

    @staticmethod
    def current_stream(device=None):
        return torch.cuda.current_stream(device)

    @staticmethod
    def new_stream(device):
        return torch.cuda.Stream(device=device)

    @staticmethod
    def new_event():
        return torch.cuda.Event()

    @staticmethod
    def stream(s):
        return torch.cuda.stream(s)

    @staticmethod
    def capturing() -> bool:
        return torch.cuda.is_current_stream_capturing()

    @staticmethod
    def record_stream(t: torch.Tensor, s) -> None:
        t.record_stream(s)


_rt = _CudaRuntime()


# =================================================================================================
# Events
# =================================================================================================

class EventHandle:
    """deep_ep_cpp.EventHandle: a CUDA event recorded on a stream (the current one by default)."""

    def __init__(self, stream: Optional[torch.cuda.Stream] = None):
        self.event = _rt.new_event()
        self.event.record(stream if stream is not None else _rt.current_stream())

    def current_stream_wait(self) -> None:
        _rt.current_stream().wait_event(self.event)


class EventOverlap:
    """deep_ep.EventOverlap: an event after communication kernels, plus tensors kept alive until it
    has been waited for (DeepEP's replacement of record_stream that stays CUDA-graph compatible)."""

    def __init__(self, event: Optional[EventHandle] = None, extra_tensors: Optional[Tuple[torch.Tensor]] = None) -> None:
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        """The current stream waits for the event (which must exist: async_finish=True)."""
        if self.event is None:
            raise EpkitError("EventOverlap.current_stream_wait: there is no event (the call ran with async_finish=False)")
        self.event.current_stream_wait()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        if self.event is not None:
            self.event.current_stream_wait()


# =================================================================================================
# Handles
# =================================================================================================

class LowLatencyHandle(tuple):
    """low_latency_dispatch's handle: DeepEP's 5-tuple (src_info, layout_range,
    num_max_dispatch_tokens_per_rank, hidden, num_experts). epkit keeps each slot's source in its own
    device map, which the Python API does not expose: src_info and layout_range are None. Pass the
    handle to low_latency_combine, get_next_low_latency_combine_buffer."""

    def __new__(cls, num_max, hidden, num_experts):
        return super().__new__(cls, (None, None, num_max, hidden, num_experts))


class NormalHandle(tuple):
    """dispatch's handle: DeepEP's intranode 6-tuple (rank_prefix_matrix, channel_prefix_matrix,
    recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_head). rank_prefix_matrix is
    [W, W] int32 with this rank's column filled (entry [i][rank]: tokens received from ranks <= i; the
    other columns -1); recv_src_idx [received] int32 the source index of each received token;
    is_token_in_rank the dispatch's. The channel matrices and send_head describe DeepEP's ring
    buffers, which epkit does not have: None. Pass it to combine, or to dispatch (cached)."""

    def __new__(cls, rank_prefix_matrix, recv_src_idx, is_token_in_rank):
        return super().__new__(cls, (rank_prefix_matrix, None, None, recv_src_idx, is_token_in_rank, None))


# =================================================================================================
# AllToAll objects and their protocol state
# =================================================================================================

_FREE, _DISPATCH_SENT, _DISPATCHED, _COMBINE_SENT = range(4)
_STATE_NAMES = ("free", "dispatch sent (its receive hook not yet called)", "dispatched",
                "combine sent (its receive hook not yet called)")


class _Slot:
    """One epkit.AllToAll with what its protocol needs: each dispatch must be followed by its combine
    before the next dispatch on the same object (all_to_all.hpp)."""

    def __init__(self, ata: _AllToAll, order: int):
        self.ata = ata
        self.state = _FREE
        self.serial = 0          # advances with every dispatch: a handle binds to one
        self.order = order       # dispatch order among the pool, for choosing one to flush
        self.m = 0
        self.topk_idx = None     # the dispatch's routing (low-latency: topk_idx; normal: rank routing)
        self.weights = None      # normal mode: the rank routing's weights (at dispatch)
        self.buffers = {}        # persistent outputs and scratch, by name
        self.tail = None         # an event at the end of its last call on a side stream

    def sync_to(self, stream) -> None:
        """Orders this call after the object's previous one if that ran on another stream."""
        if self.tail is not None:
            stream.wait_event(self.tail)
            self.tail = None

    def mark_tail(self, stream) -> None:
        ev = _rt.new_event()
        ev.record(stream)
        self.tail = ev

    def expert_y(self, device) -> torch.Tensor:
        """Normal mode's combine input rows: the dispatch rows themselves when they are bf16 (their
        contents were copied out by then), else a bf16 buffer of the same shape."""
        shape = self.ata.expert_shape()
        ex = self.buffers.get("expert_x")
        if ex is not None and ex.dtype == BF16 and tuple(ex.shape) == tuple(shape):
            return ex
        return self.buffer("expert_y", shape, BF16, device)

    def buffer(self, name: str, shape, dtype, device) -> torch.Tensor:
        t = self.buffers.get(name)
        if t is None or tuple(t.shape) != tuple(shape) or t.dtype != dtype:
            t = torch.empty(shape, dtype=dtype, device=device)
            self.buffers[name] = t
        return t


def _capturing() -> bool:
    return _rt.capturing()


# =================================================================================================
# Buffer
# =================================================================================================

class Buffer:
    """deep_ep.Buffer over epkit: expert-parallel dispatch and combine for one torch.distributed group.

    Construction is collective. NVSHMEM is bootstrapped over the group if nobody has initialised it
    (epkit.nvshmem_init otherwise; its PE numbering must be the group's). num_nvl_bytes and
    num_rdma_bytes size DeepEP's buffers; epkit allocates what its calls need when they first come
    (symmetric memory per configuration, python/README.md), so both are accepted and ignored.

    epkit-only keywords: num_max_tokens_per_rank (normal mode: a fixed bound on tokens per rank; without
    it the bound follows the largest call, agreed over the group), path ("auto" or "portable": force
    put-with-signal to every peer), timeout_ms (every device wait's bound), host_checks (the
    expert-index check above)."""

    num_sms: int = spec.DEFAULT_NUM_SMS

    def __init__(self, group: Optional[dist.ProcessGroup], num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, num_qps_per_rank: int = 24,
                 allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False, use_fabric: bool = False,
                 explicitly_destroy: bool = False, enable_shrink: bool = False, comm=None, *,
                 num_max_tokens_per_rank: Optional[int] = None, path: Optional[str] = None, timeout_ms: int = -1,
                 host_checks: Optional[bool] = None) -> None:
        for name, v in (("num_nvl_bytes", num_nvl_bytes), ("num_rdma_bytes", num_rdma_bytes),
                        ("num_qps_per_rank", num_qps_per_rank)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise EpkitError(f"Buffer: {name} = {v!r} must be an int >= 0")
        if enable_shrink:
            raise EpkitError("Buffer: enable_shrink=True (masking failed ranks) is not supported: epkit bounds every wait "
                             "and reports the peer instead; pass enable_shrink=False")
        if path not in (None, "auto", "portable"):
            raise EpkitError(f"Buffer: path = {path!r} must be None, 'auto' or 'portable'")
        if num_max_tokens_per_rank is None and os.environ.get("EPKIT_DEEP_EP_MAX_TOKENS"):
            num_max_tokens_per_rank = int(os.environ["EPKIT_DEEP_EP_MAX_TOKENS"])
        if num_max_tokens_per_rank is not None and not 1 <= int(num_max_tokens_per_rank) <= spec.MAX_TOKENS_PER_RANK:
            raise EpkitError(f"Buffer: num_max_tokens_per_rank = {num_max_tokens_per_rank} must be in "
                             f"[1, {spec.MAX_TOKENS_PER_RANK}]")
        if group is not None:
            self.group = group
            self.rank = dist.get_rank(group)
            self.group_size = dist.get_world_size(group)
        elif comm is not None:
            self.group = comm
            self.rank = comm.Get_rank()
            self.group_size = comm.Get_size()
        else:
            raise EpkitError("Buffer: either group or comm must be given")
        self._mpi = group is None
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = bool(low_latency_mode)
        self.explicitly_destroy = bool(explicitly_destroy)
        self.enable_shrink = False
        self._ll_path = path or ("auto" if allow_nvlink_for_low_latency_mode else "portable")
        self._normal_path = path or "auto"
        self._timeout_ms = int(timeout_ms)
        if host_checks is None:
            host_checks = os.environ.get("EPKIT_DEEP_EP_HOST_CHECKS", "1") != "0"
        self._host_checks = bool(host_checks)
        self._pinned_tokens = None if num_max_tokens_per_rank is None else int(num_max_tokens_per_rank)
        self._normal_tokens = 0  # the bound of the normal-mode objects alive now

        self._bootstrap()
        self.device = _rt.device()
        if _rt.current_device() != self.device.index:
            raise EpkitError(f"Buffer: the current CUDA device is cuda:{_rt.current_device()} but this NVSHMEM "
                             f"PE uses cuda:{self.device.index}")
        self._comm_stream = _rt.new_stream(self.device)
        self._pools = {}        # key -> [_Slot]
        self._orders = 0
        self._arange_cache = {}
        self._templates = {}
        self._alive = True

    # -- construction helpers ----------------------------------------------------------------------
    def _bootstrap(self) -> None:
        if _C.initialized():
            if _C.my_pe() != self.rank or _C.n_pes() != self.group_size:
                raise EpkitError(f"Buffer: NVSHMEM is initialised as PE {_C.my_pe()} of {_C.n_pes()}, but the group "
                                 f"has rank {self.rank} of {self.group_size}; epkit's PEs must be the group's ranks")
            return
        uid = nvshmem_get_unique_id() if self.rank == 0 else nvshmem_alloc_empty_unique_id()
        if self._mpi:
            data = self.group.bcast(bytes(uid.tolist()) if self.rank == 0 else None, root=0)
        else:
            box = [bytes(uid.tolist())]
            dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0), group=self.group)
            data = box[0]
        nvshmem_init(torch.frombuffer(bytearray(data), dtype=torch.uint8), self.rank, self.group_size)

    def _exchange(self, m: int, per_expert: Optional[torch.Tensor], L: int):
        """One host all-gather over the group: (the largest m of any rank, and with per_expert the tokens
        every rank sends to each of this rank's experts, summed: DeepEP's num_recv_tokens_per_expert)."""
        if self._mpi:
            mine = [m] + ([] if per_expert is None else per_expert.tolist())
            rows = self.group.allgather(mine)
            counts = None
            if per_expert is not None:
                counts = [sum(r[1 + self.rank * L + e] for r in rows) for e in range(L)]
            return max(r[0] for r in rows), counts
        on_cpu = dist.get_backend(self.group) == "gloo"
        dev = torch.device("cpu") if on_cpu else self.device
        n = 1 + (0 if per_expert is None else per_expert.numel())
        mine = torch.empty(n, dtype=torch.int64, device=dev)
        mine[0] = m
        if per_expert is not None:
            mine[1:] = per_expert.to(device=dev, dtype=torch.int64)
        rows = [torch.empty_like(mine) for _ in range(self.group_size)]
        dist.all_gather(rows, mine, group=self.group)
        table = torch.stack(rows).cpu()
        counts = None
        if per_expert is not None:
            counts = table[:, 1 + self.rank * L:1 + (self.rank + 1) * L].sum(0).tolist()
        return int(table[:, 0].max()), counts

    def _new_all_to_all(self, **fields) -> _AllToAll:
        cfg = AllToAllConfig(world_size=self.group_size, rank=self.rank, dp_size=1, layout="masked",
                             timeout_ms=self._timeout_ms, **fields)
        return _AllToAll(cfg)

    def _arange(self, n: int) -> torch.Tensor:
        a = self._arange_cache.get(n)
        if a is None:
            a = self._arange_cache[n] = torch.arange(n, dtype=torch.int32, device=self.device)
        return a

    def _require_alive(self) -> None:
        if not self._alive:
            raise EpkitError("this Buffer was destroyed")

    def _on_device(self, *named) -> None:
        for name, t in named:
            if t is not None and t.device != self.device:
                raise EpkitError(f"{name} is on {t.device}; this Buffer's rank uses {self.device}")

    def _check_range(self, topk_idx: torch.Tensor, num_experts: int) -> None:
        if self._host_checks and topk_idx.numel() and not _capturing():
            spec.check_expert_range(int(topk_idx.max()), num_experts)

    # -- pools -------------------------------------------------------------------------------------
    def _acquire(self, key, make: Callable[[], _AllToAll], flush: Callable[[_Slot], None]) -> _Slot:
        """An object of this configuration that may be dispatched on: a free one; else a second one (made
        here, collectively); else the one dispatched longest ago, whose dispatch is then completed by a
        discarded combine (its handle becomes stale)."""
        self._raise_if_failed()
        slots = self._pools.setdefault(key, [])
        for s in slots:
            if s.state == _FREE:
                return s
        if len(slots) < 2:
            if _capturing():
                raise EpkitError("epkit.deep_ep: this call's configuration first appears inside a CUDA graph capture, "
                                 "where its AllToAll cannot be created (it allocates and agrees with every rank); run "
                                 "the same call once before capturing")
            s = _Slot(make(), 0)
            slots.append(s)
            return s
        waiting = [s for s in slots if s.state == _DISPATCHED]
        if not waiting:
            raise EpkitError("epkit.deep_ep: both buffers of this configuration have a receive hook pending (DeepEP "
                             "keeps two as well): call their hooks before the next dispatch")
        s = min(waiting, key=lambda s: s.order)
        flush(s)
        return s

    def _raise_if_failed(self) -> None:
        """After a device-side timeout (a dead or stuck peer) the Buffer refuses every dispatch at once.
        Without this, a dispatch finding its object still busy from the failed layer would create a
        second one, collectively with the dead peer, and wait out the host collective's timeout."""
        for slots in self._pools.values():
            for s in slots:
                if s.ata.alive and s.ata.failed:
                    try:
                        s.ata.check()
                        msg = "a device-side timeout was recorded"
                    except EpkitError as e:
                        msg = str(e)
                    raise EpkitError(f"epkit.deep_ep: this Buffer is unusable after a device-side timeout of one of "
                                     f"its AllToAll objects (its peers are out of step): {msg}")

    def _claim(self, slot: _Slot, state: int) -> int:
        self._orders += 1
        slot.order = self._orders
        slot.serial += 1
        slot.state = state
        return slot.serial

    def _destroy_slots(self, keep=lambda key: False) -> None:
        for key in list(self._pools):
            if keep(key):
                continue
            for s in self._pools.pop(key):
                s.ata.destroy()
                s.state = -1
                s.serial += 1

    # -- static API ----------------------------------------------------------------------------
    @staticmethod
    def is_sm90_compiled() -> bool:
        """epkit's kernels are built for sm_90a (Hopper)."""
        return True

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        """The SMs normal-mode calls may use (epkit's num_sms), for objects created afterwards."""
        if isinstance(new_num_sms, bool) or not isinstance(new_num_sms, int) or new_num_sms < 0:
            raise EpkitError(f"set_num_sms: {new_num_sms!r} must be an int >= 0")
        if new_num_sms % 2 != 0:
            raise EpkitError(f"set_num_sms: the SM count must be even (as in DeepEP), got {new_num_sms}")
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        """An event on the current stream."""
        return EventOverlap(EventHandle())

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int) -> int:
        """DeepEP's formula (LowLatencyLayout, csrc/config.hpp); epkit needs far less (README)."""
        return spec.low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        return spec.recommended_config(spec.DISPATCH_CONFIGS, num_ranks, Buffer.num_sms, "get_dispatch_config")

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        return spec.recommended_config(spec.COMBINE_CONFIGS, num_ranks, Buffer.num_sms, "get_combine_config")

    # -- lifetime and raw access ---------------------------------------------------------------
    def destroy(self) -> None:
        """Frees every AllToAll of this Buffer. Collective. As in DeepEP, only with explicitly_destroy=True
        (otherwise they are freed at nvshmem_finalize)."""
        if not self.explicitly_destroy:
            raise EpkitError("Buffer.destroy needs explicitly_destroy=True (as in DeepEP)")
        if self._alive:
            self._destroy_slots()
            self._alive = False

    def check(self) -> None:
        """epkit extra: raises EpkitError if a finished call recorded a device-side error (an expert index
        out of range, a timeout naming the peer). Synchronise first."""
        for slots in self._pools.values():
            for s in slots:
                s.ata.check()

    @property
    def symmetric_bytes(self) -> int:
        """epkit extra: NVSHMEM symmetric memory held by this Buffer's objects now."""
        return sum(s.ata.symmetric_bytes for slots in self._pools.values() for s in slots)

    def get_comm_stream(self):
        return self._comm_stream

    def get_local_buffer_tensor(self, dtype, size=None, offset: int = 0, use_rdma_buffer: bool = False):
        raise EpkitError("get_local_buffer_tensor is not supported: epkit has no raw NVL/RDMA buffer to expose "
                         "(its symmetric regions are laid out per call type)")

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """A no-op: epkit's flags are tagged with a sequence number and never need cleaning."""
        for name, v in (("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank), ("hidden", hidden),
                        ("num_experts", num_experts)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise EpkitError(f"clean_low_latency_buffer: {name} = {v!r} must be an int >= 1")

    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False):
        raise EpkitError("low_latency_update_mask_buffer: rank masking (enable_shrink) is not supported by epkit")

    def low_latency_query_mask_buffer(self, mask_status: torch.Tensor):
        raise EpkitError("low_latency_query_mask_buffer: rank masking (enable_shrink) is not supported by epkit")

    def low_latency_clean_mask_buffer(self):
        raise EpkitError("low_latency_clean_mask_buffer: rank masking (enable_shrink) is not supported by epkit")

    # -- streams ---------------------------------------------------------------------------------
    def _launch_stream(self, previous_event: Optional[EventOverlap], async_finish: bool):
        """(compute stream, the stream the call runs on). DeepEP runs an async_finish call on its comm
        stream after previous_event (normal mode) or the compute stream; a call with neither an event
        nor async_finish runs on the compute stream itself, which orders it the same way."""
        compute = _rt.current_stream(self.device)
        if previous_event is None and not async_finish:
            return compute, compute
        comm = self._comm_stream
        if previous_event is not None:
            if not isinstance(previous_event, EventOverlap) or previous_event.event is None:
                raise EpkitError("previous_event must be an EventOverlap holding an event (Buffer.capture())")
            comm.wait_event(previous_event.event.event)
        else:
            comm.wait_stream(compute)
        return compute, comm

    def _finish(self, compute, stream, slot: Optional[_Slot], async_finish: bool, inputs=(), outputs=()):
        """After a call on `stream`: an event for async_finish, else the compute stream waits; tensors used
        across the two streams are recorded on the other one (DeepEP's record_stream)."""
        if stream is compute:
            return EventOverlap(None)
        for t in inputs:
            if t is not None:
                _rt.record_stream(t, stream)
        for t in outputs:
            if t is not None:
                _rt.record_stream(t, compute)
        if slot is not None:
            slot.mark_tail(stream)
        if async_finish:
            return EventOverlap(EventHandle(stream))
        compute.wait_stream(stream)
        return EventOverlap(None)

    # =============================================================================================
    # Low-latency mode
    # =============================================================================================
    def _require_low_latency(self, call: str) -> None:
        self._require_alive()
        if not self.low_latency_mode:
            raise EpkitError(f"{call} needs Buffer(..., low_latency_mode=True) (as in DeepEP)")

    def _ll_flush(self, slot: _Slot) -> None:
        """Completes a dispatch nobody combined, so that its object can be dispatched on again."""
        ata = slot.ata
        cfg = ata.config
        m, k = slot.topk_idx.shape
        stream = _rt.current_stream(self.device)
        slot.sync_to(stream)
        y = slot.buffer("combine_buffer", ata.expert_shape(), BF16, self.device)
        w = torch.zeros((m, k), dtype=torch.float32, device=self.device)
        out = slot.buffer("flush_out", (cfg.max_tokens_per_rank, cfg.hidden), BF16, self.device)
        ata._combine(_BOTH, y, slot.topk_idx, w, m, out[:m])
        # The object's next call may run on another stream (the comm stream): it must wait for this
        # combine, which reads the buffers that call overwrites.
        slot.mark_tail(stream)
        slot.state = _FREE
        slot.serial += 1
        slot.topk_idx = None

    def low_latency_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, num_max_dispatch_tokens_per_rank: int,
                             num_experts: int, cumulative_local_expert_recv_stats: Optional[torch.Tensor] = None,
                             dispatch_wait_recv_cost_stats: Optional[torch.Tensor] = None, use_fp8: bool = True,
                             round_scale: bool = False, use_ue8m0: bool = False, async_finish: bool = False,
                             return_recv_hook: bool = False):
        """Returns (recv_x, recv_count, handle, event, hook) as DeepEP does.

        recv_x: [E/W, W * M, H] bf16, or with use_fp8 (fp8 e4m3 [E/W, W * M, H], scales): scales [E/W,
        W * M, H/128] fp32, or with use_ue8m0 [E/W, W * M, ceil(H/512)] int32 of packed exponent bytes,
        both column-major views as in DeepEP. Expert e's rows are recv_x[e, :recv_count[e]]: this rank's
        tokens first, then those of ranks rank + 1, ..., one contiguous run per source. fp8 uses epkit's
        quantizer (scale = max(amax, 1e-10) / 448, its power-of-two ceiling with round_scale).
        With return_recv_hook the send half runs now and hook() runs the receive half (on this stream)."""
        self._require_low_latency("low_latency_dispatch")
        W = self.group_size
        m, H, K = spec.check_low_latency_dispatch(
            x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, W, cumulative_local_expert_recv_stats,
            dispatch_wait_recv_cost_stats, use_fp8, round_scale, use_ue8m0, async_finish, return_recv_hook)
        self._on_device(("x", x), ("topk_idx", topk_idx),
                        ("cumulative_local_expert_recv_stats", cumulative_local_expert_recv_stats))
        self._check_range(topk_idx, num_experts)
        M, E = num_max_dispatch_tokens_per_rank, num_experts
        L, N, S = E // W, W * M, H // spec.SCALE_BLOCK
        # fp32 scales: dispatch writes them straight into DeepEP's column-major layout (each expert's
        # [S, N] block, returned as its transposed view). UE8M0 packs four exponents per int32 word
        # after dispatch, from row-major scales.
        mn_major = bool(use_fp8) and not use_ue8m0
        key = ("ll", M, H, E, K, bool(use_fp8), mn_major)

        def make():
            return self._new_all_to_all(num_experts=E, topk=K, hidden=H, max_tokens_per_rank=M,
                                        dispatch_dtype=FP8 if use_fp8 else BF16, combine_in_dtype=BF16,
                                        combine_out_dtype=BF16, num_sms=0, path=self._ll_path,
                                        expert_scales_mn_major=mn_major)

        slot = self._acquire(key, make, self._ll_flush)
        compute, stream = self._launch_stream(None, async_finish)
        slot.sync_to(stream)

        # Outputs on the compute stream, as DeepEP allocates them.
        recv_x = torch.empty((L, N, H), dtype=FP8 if use_fp8 else BF16, device=self.device)
        recv_count = torch.empty((L,), dtype=torch.int32, device=self.device)
        expert_scale = scales = None  # what dispatch writes; what the caller gets
        if mn_major:
            scales = spec.empty_deepep_scales(L, N, S, False, self.device)
            expert_scale = scales.transpose(1, 2)  # its [L, S, N] storage
        elif use_fp8:  # UE8M0: row-major scales, packed after dispatch
            expert_scale = torch.empty((L, N, S), dtype=torch.float32, device=self.device)
            scales = spec.empty_deepep_scales(L, N, S, True, self.device)
        out = DispatchOutput(recv_x, expert_scale, recv_count)
        stats = cumulative_local_expert_recv_stats
        ata = slot.ata

        with _rt.stream(stream):
            if use_fp8:
                q = _quantize(x, ue8m0=round_scale)
                xin, xs = q.q, q.scale
            else:
                xin, xs = x, None
            ata._dispatch(_SEND if return_recv_hook else _BOTH, xin, topk_idx, xs, m, out, None)

        def receive_side():
            if use_fp8 and not mn_major:
                spec.pack_ue8m0_scales(scales, expert_scale)
            if stats is not None:
                stats.add_(recv_count)

        serial = self._claim(slot, _DISPATCH_SENT if return_recv_hook else _DISPATCHED)
        slot.m, slot.topk_idx = m, topk_idx
        handle = LowLatencyHandle(M, H, E)
        handle._slot, handle._serial, handle._m, handle._topk = slot, serial, m, K

        hook = None
        event = EventOverlap(None)
        if return_recv_hook:
            def hook():
                if slot.serial != serial or slot.state != _DISPATCH_SENT:
                    raise EpkitError("this dispatch's receive hook was already called (or its buffer was reused)")
                with _rt.stream(stream):
                    ata._dispatch(_RECV, xin, topk_idx, xs, m, out, None)
                    receive_side()
                slot.state = _DISPATCHED
        else:
            with _rt.stream(stream):
                receive_side()
            if async_finish:
                slot.mark_tail(stream)
                event = EventOverlap(EventHandle(stream), (x, topk_idx, recv_x, scales, recv_count, stats))
        recv = (recv_x, scales) if use_fp8 else recv_x
        return recv, recv_count, handle, event, hook

    def _ll_handle(self, handle) -> LowLatencyHandle:
        if not isinstance(handle, LowLatencyHandle):
            raise EpkitError(f"handle must come from this Buffer's low_latency_dispatch, got {type(handle).__name__}")
        slot = handle._slot
        if slot.serial != handle._serial or slot.state != _DISPATCHED:
            what = _STATE_NAMES[slot.state] if 0 <= slot.state < len(_STATE_NAMES) else "destroyed"
            raise EpkitError(f"this low-latency handle is stale: its buffer is {what}"
                             + ("" if slot.serial == handle._serial else " by a later dispatch")
                             + ". epkit combines each dispatch once, and at most two dispatches may be in flight "
                             "(call the dispatch's hook before combining)")
        return handle

    def get_next_low_latency_combine_buffer(self, handle) -> torch.Tensor:
        """The [E/W, W * M, H] bf16 tensor low_latency_combine(..., zero_copy=True) reads instead of x."""
        self._require_low_latency("get_next_low_latency_combine_buffer")
        h = self._ll_handle(handle)
        return h._slot.buffer("combine_buffer", h._slot.ata.expert_shape(), BF16, self.device)

    def low_latency_combine(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, handle,
                            use_logfmt: bool = False, zero_copy: bool = False, async_finish: bool = False,
                            return_recv_hook: bool = False, out: Optional[torch.Tensor] = None,
                            combine_wait_recv_cost_stats: Optional[torch.Tensor] = None, **overlap_args):
        """Returns (combined_x, event, hook): combined_x[t] = sum_k topk_weights[t, k] * x(expert k's row
        of token t), [num_tokens, H] bf16 (in `out` if given)."""
        spec.check_sbo_arguments(overlap_args)
        self._require_low_latency("low_latency_combine")
        h = self._ll_handle(handle)
        _, _, M, H, E = h
        W = self.group_size
        m = spec.check_low_latency_combine(x, topk_idx, topk_weights, E // W, W, M, H, h._m, h._topk, out, use_logfmt,
                                           async_finish, return_recv_hook, combine_wait_recv_cost_stats)
        self._on_device(("x", x), ("topk_idx", topk_idx), ("topk_weights", topk_weights), ("out", out))
        slot = h._slot
        y = x
        if zero_copy:
            y = slot.buffers.get("combine_buffer")
            if y is None:
                raise EpkitError("zero_copy=True reads the tensor of get_next_low_latency_combine_buffer(handle): "
                                 "call it (and fill it) first")
        combined = out if out is not None else torch.empty((m, H), dtype=BF16, device=self.device)
        compute, stream = self._launch_stream(None, async_finish)
        slot.sync_to(stream)
        ata = slot.ata
        with _rt.stream(stream):
            ata._combine(_SEND if return_recv_hook else _BOTH, y, topk_idx, topk_weights, m, combined)
        serial = slot.serial
        hook = None
        event = EventOverlap(None)
        if return_recv_hook:
            slot.state = _COMBINE_SENT

            def hook():
                if slot.serial != serial or slot.state != _COMBINE_SENT:
                    raise EpkitError("this combine's receive hook was already called")
                with _rt.stream(stream):
                    ata._combine(_RECV, y, topk_idx, topk_weights, m, combined)
                slot.state = _FREE
                slot.topk_idx = None
        else:
            slot.state = _FREE
            slot.topk_idx = None
            if async_finish:
                slot.mark_tail(stream)
                event = EventOverlap(EventHandle(stream), (x, topk_idx, topk_weights, combined))
        return combined, event, hook

    # =============================================================================================
    # Normal mode
    # =============================================================================================
    def _template(self, max_tokens: int) -> torch.Tensor:
        t = self._templates.get(max_tokens)
        if t is None:
            t = self._templates[max_tokens] = spec.meta_template(max_tokens, self.rank, self.device)
        return t

    def _normal_bound(self, m: int, num_worst_tokens: int, group_max: Optional[int]) -> int:
        """M of the normal-mode objects for a call of m tokens: the pinned bound; with num_worst_tokens its
        share per rank (the same on every rank, no communication); else the group's largest m (group_max,
        from _exchange). Grows in powers of two; growing frees the older objects (collectively)."""
        if self._pinned_tokens is not None:
            if m > self._pinned_tokens:
                raise EpkitError(f"x has {m} tokens, more than Buffer(num_max_tokens_per_rank={self._pinned_tokens})")
            return self._pinned_tokens
        if num_worst_tokens > 0:
            need = spec.ceil_div(num_worst_tokens, self.group_size)
        else:
            need = group_max
        bound = spec.normal_max_tokens(self._normal_tokens, need)
        if m > bound:
            raise EpkitError(f"x has {m} tokens, more than num_worst_tokens = {num_worst_tokens} allows per rank "
                             f"({bound}); pass Buffer(..., num_max_tokens_per_rank=...) for a fixed bound")
        if bound != self._normal_tokens:
            if _capturing():
                raise EpkitError(f"epkit.deep_ep: normal mode needs objects for {bound} tokens per rank inside a CUDA "
                                 f"graph capture; run the same call once before capturing")
            self._destroy_slots(keep=lambda key: key[0] == "ll")
            self._normal_tokens = bound
        return bound

    def _normal_flush(self, slot: _Slot) -> None:
        ata = slot.ata
        cfg = ata.config
        stream = _rt.current_stream(self.device)
        slot.sync_to(stream)
        y = slot.expert_y(self.device)
        out = slot.buffer("flush_out", (cfg.max_tokens_per_rank, cfg.hidden), BF16, self.device)
        ata._combine(_BOTH, y, slot.topk_idx, None, slot.m, out[:slot.m])
        slot.mark_tail(stream)  # as in _ll_flush: the next call may run on the comm stream
        slot.state = _FREE
        slot.serial += 1
        slot.topk_idx = slot.weights = None

    def _normal_handle(self, handle) -> NormalHandle:
        if not isinstance(handle, NormalHandle):
            raise EpkitError(f"handle must come from this Buffer's dispatch, got {type(handle).__name__}")
        return handle

    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int, previous_event: Optional[EventOverlap] = None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """Returns (num_tokens_per_rank [W] int32, num_tokens_per_rdma_rank [W/8] int32 or None (one NVLink
        domain of 8), num_tokens_per_expert [E] int32, is_token_in_rank [m, W] bool, event)."""
        self._require_alive()
        spec.check_dispatch_layout(topk_idx, num_experts, self.group_size)
        spec.check_stream_flags(previous_event, async_finish, allocate_on_comm_stream)
        self._on_device(("topk_idx", topk_idx))
        self._check_range(topk_idx, num_experts)
        compute, stream = self._launch_stream(previous_event, async_finish)
        with _rt.stream(stream):
            per_rank, per_rdma, per_expert, in_rank = spec.dispatch_layout(topk_idx, num_experts, self.group_size)
        event = self._finish(compute, stream, None, async_finish, (topk_idx,), (per_rank, per_rdma, per_expert, in_rank))
        return per_rank, per_rdma, per_expert, in_rank, event

    def dispatch(self, x: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]], handle: Optional[tuple] = None,
                 num_tokens_per_rank: Optional[torch.Tensor] = None, num_tokens_per_rdma_rank: Optional[torch.Tensor] = None,
                 is_token_in_rank: Optional[torch.Tensor] = None, num_tokens_per_expert: Optional[torch.Tensor] = None,
                 topk_idx: Optional[torch.Tensor] = None, topk_weights: Optional[torch.Tensor] = None,
                 expert_alignment: int = 1, num_worst_tokens: int = 0, config: Optional[Config] = None,
                 previous_event: Optional[EventOverlap] = None, async_finish: bool = False,
                 allocate_on_comm_stream: bool = False):
        """Returns (recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event).

        recv_x: the tokens sent to this rank, once per (token, source rank), ordered by source rank, then
        by token index: [received, H] (or (fp8, scales) as given). recv_topk_idx [received, K] int64: each
        entry's local expert (expert - rank * E/W) where it is this rank's, else -1; recv_topk_weights the
        weights there, 0 elsewhere. The list: tokens per local expert, each rounded up to expert_alignment
        (empty with num_worst_tokens, which sizes the outputs instead: no host synchronisation, rows past
        the received ones have top-k -1). A handle as `handle` re-sends with the same layout (cached)."""
        self._require_alive()
        W = self.group_size
        xt, xs = spec.split_x(x)
        h = None if handle is None else self._normal_handle(handle)
        m, H, E, K = spec.check_normal_dispatch(xt, xs, h is not None, num_tokens_per_rank, is_token_in_rank,
                                                num_tokens_per_expert, topk_idx, topk_weights, expert_alignment,
                                                num_worst_tokens, W)
        spec.check_stream_flags(previous_event, async_finish, allocate_on_comm_stream)
        if config is not None and not isinstance(config, Config):
            raise EpkitError(f"config must be an epkit.deep_ep.Config, got {type(config).__name__}")
        self._on_device(("x", xt), ("x scales", xs), ("is_token_in_rank", is_token_in_rank), ("topk_idx", topk_idx),
                        ("topk_weights", topk_weights), ("num_tokens_per_rank", num_tokens_per_rank),
                        ("num_tokens_per_expert", num_tokens_per_expert))
        if self._pinned_tokens is not None and m > self._pinned_tokens:
            raise EpkitError(f"x has {m} tokens, more than Buffer(num_max_tokens_per_rank={self._pinned_tokens})")
        if h is not None:
            if m != h._m or H != h._hidden or xt.dtype != h._dtype or (xs is None) != (h._scale_cols == 0) or (
                    xs is not None and xs.shape[1] != h._scale_cols):
                raise EpkitError(f"a cached dispatch must send what the handle's dispatch sent: x of [{h._m}, "
                                 f"{h._hidden}] {h._dtype} with {h._scale_cols} scale columns, got [{m}, {H}] "
                                 f"{xt.dtype} with {0 if xs is None else xs.shape[1]}")
            routing, rweights, in_rank = h._routing, h._rweights, h._in_rank
            worst, K, E = h._worst, 0, h._num_experts
        else:
            if topk_idx is not None:
                self._check_range(topk_idx, E)
            routing = spec.routing_from_rank_mask(is_token_in_rank)
            rweights = (routing >= 0).to(torch.float32)
            in_rank, worst = is_token_in_rank, num_worst_tokens
        L = E // W
        # Without num_worst_tokens the ranks agree on the objects' bound (unless it is pinned), and without
        # top-k the per-expert counts come from every rank's num_tokens_per_expert: one host all-gather.
        group_max = gathered = None
        counts_from_ranks = h is None and worst == 0 and K == 0
        if worst == 0 and (self._pinned_tokens is None or counts_from_ranks):
            group_max, gathered = self._exchange(m, num_tokens_per_expert if counts_from_ranks else None, L)
        num_sms = config.num_sms if config is not None else Buffer.num_sms
        M = self._normal_bound(m, worst, group_max)
        Hp = spec.normal_hidden(H, xt.dtype)
        Sp = spec.normal_scale_columns(H) if xs is not None else 0
        key = ("normal", M, Hp, xt.dtype, Sp, num_sms)

        def make():
            return self._new_all_to_all(num_experts=W, topk=spec.normal_route_width(W), hidden=Hp,
                                        max_tokens_per_rank=M, dispatch_dtype=xt.dtype, combine_in_dtype=BF16,
                                        combine_out_dtype=BF16, num_sms=num_sms, path=self._normal_path,
                                        weights_at_dispatch=True)

        slot = self._acquire(key, make, self._normal_flush)
        cap = M * W
        compute, stream = self._launch_stream(previous_event, async_finish)
        slot.sync_to(stream)
        with _rt.stream(stream):
            meta = spec.pack_meta(self._template(M), m, topk_idx, topk_weights)
            xw = spec.append_meta(xt, meta)
            xsw = spec.widen_scales(xs, Sp) if xs is not None else None
            out = DispatchOutput(slot.buffer("expert_x", (1, cap, Hp), xt.dtype, self.device),
                                 slot.buffer("expert_x_scale", (1, cap, Sp), torch.float32, self.device) if Sp else None,
                                 slot.buffer("expert_num_tokens", (1,), torch.int32, self.device))
            slot.ata._dispatch(_BOTH, xw, routing, xsw, m, out, rweights)

            # The received rows, in DeepEP's order: by (source rank, token index).
            ex = out.expert_x[0]
            meta_rows = ex[:, H:].view(torch.int32)
            n_dev = out.expert_num_tokens
            valid = self._arange(cap) < n_dev
            token, src, gidx, gw = spec.unpack_meta(meta_rows, K)
            keys = torch.where(valid, src.to(torch.int64) * M + token.to(torch.int64),
                               torch.full((cap,), cap, dtype=torch.int64, device=self.device))
            perm = torch.sort(keys).indices
            recv_idx_all = recv_w_all = None
            if K:
                recv_idx_all, recv_w_all, _ = spec.remap_topk(gidx, gw, valid, self.rank, L)
            counts_list: List[int] = []
            if h is not None:
                rows = h._rows
            elif worst > 0:
                rows = worst
            else:
                # One host synchronisation for the received count and the per-expert counts (as DeepEP's).
                parts = [n_dev.to(torch.int64)]
                if K:
                    parts.append(spec.local_expert_counts(recv_idx_all, L))
                host = torch.cat(parts).tolist()
                rows = host[0]
                counts_list = spec.align_counts(host[1:] if K else gathered, expert_alignment)
            sel = perm[:min(rows, cap)]
            recv_x = spec.gather_rows(ex[:, :H], sel, rows)
            recv_scales = None
            if xs is not None:
                recv_scales = spec.gather_rows(out.expert_x_scale[0][:, :xs.shape[1]], sel, rows).view(xs.dtype)
            recv_topk_idx = recv_topk_weights = None
            if K:
                recv_topk_idx = spec.gather_rows(recv_idx_all, sel, rows, fill=-1)
                recv_topk_weights = spec.gather_rows(recv_w_all, sel, rows, fill=0)
            sorted_keys = keys.index_select(0, sel)
            if h is None:
                recv_src_idx = spec.gather_rows(token, sel, rows, fill=-1)
                prefix = spec.rank_prefix_matrix(src, valid, W, self.rank)

        serial = self._claim(slot, _DISPATCHED)
        slot.m, slot.topk_idx, slot.weights = m, routing, rweights
        if h is None:
            h = NormalHandle(prefix, recv_src_idx, in_rank)
            h._m, h._hidden, h._dtype, h._scale_cols = m, H, xt.dtype, 0 if xs is None else xs.shape[1]
            h._routing, h._rweights, h._in_rank, h._worst, h._rows = routing, rweights, in_rank, worst, rows
            h._num_experts = E
        h._slot, h._serial, h._sel, h._sorted_keys, h._bound = slot, serial, sel, sorted_keys, M

        recv = (recv_x, recv_scales) if xs is not None else recv_x
        new_handle = () if handle is not None else (h[0], h[3])
        event = self._finish(compute, stream, slot, async_finish, (xt, xs, topk_idx, topk_weights, is_token_in_rank),
                             (recv_x, recv_scales, recv_topk_idx, recv_topk_weights) + new_handle)
        if handle is not None:
            return recv, None, None, None, None, event
        return recv, recv_topk_idx, recv_topk_weights, counts_list, h, event

    def combine(self, x: torch.Tensor, handle: tuple, topk_weights: Optional[torch.Tensor] = None,
                bias: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor], None] = None,
                config: Optional[Config] = None, previous_event: Optional[EventOverlap] = None,
                async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """Returns (combined_x, combined_topk_weights, event): combined_x[t] = the sum over the ranks token t
        was sent to of that rank's x row for it (no weights), [num_tokens, H] bf16, summed in fp32 and
        rounded once; combined_topk_weights the same sum of topk_weights rows in fp32, in rank order
        (None without topk_weights). The handle's dispatch must be the last one on its buffer."""
        self._require_alive()
        h = self._normal_handle(handle)
        K = spec.check_normal_combine(x, h._rows, h._hidden, topk_weights, bias)
        spec.check_stream_flags(previous_event, async_finish, allocate_on_comm_stream)
        if config is not None and not isinstance(config, Config):
            raise EpkitError(f"config must be an epkit.deep_ep.Config, got {type(config).__name__}")
        self._on_device(("x", x), ("topk_weights", topk_weights))
        slot = h._slot
        if slot.serial != h._serial or slot.state != _DISPATCHED:
            raise EpkitError("this handle is stale: its buffer was dispatched on again or already combined. epkit "
                             "combines each dispatch once; to combine again, dispatch again with handle=handle")
        ata = slot.ata
        H, Hp, m = h._hidden, ata.config.hidden, h._m
        compute, stream = self._launch_stream(previous_event, async_finish)
        slot.sync_to(stream)
        with _rt.stream(stream):
            y = slot.expert_y(self.device)
            sel = h._sel
            spec.as_int_view(y[0, :, :H]).index_copy_(0, sel, spec.as_int_view(x[:sel.shape[0]]))
            wide = torch.empty((m, Hp), dtype=BF16, device=self.device)
            ata._combine(_BOTH, y, h._routing, None, m, wide)
            combined = wide[:, :H].contiguous()
        slot.state = _FREE
        slot.topk_idx = slot.weights = None
        combined_w = None
        if K:
            with _rt.stream(stream):
                combined_w = self._combine_topk_weights(h, topk_weights, K)
        return combined, combined_w, self._finish(compute, stream, slot, async_finish, (x, topk_weights),
                                                  (combined, combined_w))

    def _combine_topk_weights(self, h: NormalHandle, topk_weights: torch.Tensor, K: int) -> torch.Tensor:
        """combined_topk_weights, exactly: a second, small dispatch/combine pair with the handle's routing
        brings each rank's weights back as three bf16 pieces in that rank's own columns (so the combine's
        sum adds only zeros to them), and the pieces are joined and summed over ranks in rank order."""
        W, M, m = self.group_size, h._bound, h._m
        Hw = spec.weights_hidden(W, K)
        key = ("weights", M, Hw)

        def make():
            return self._new_all_to_all(num_experts=W, topk=spec.normal_route_width(W), hidden=Hw,
                                        max_tokens_per_rank=M, dispatch_dtype=BF16, combine_in_dtype=BF16,
                                        combine_out_dtype=BF16, num_sms=0, path=self._normal_path,
                                        weights_at_dispatch=True)

        slot = self._acquire(key, make, self._normal_flush)
        slot.sync_to(_rt.current_stream(self.device))
        cap = M * W
        tmpl = self._templates.get(("weights", M, Hw))
        if tmpl is None:
            tmpl = torch.zeros((M, Hw), dtype=BF16, device=self.device)
            tmpl[:, :4].view(torch.int32).copy_(self._template(M)[:, :2])
            self._templates[("weights", M, Hw)] = tmpl
        out = DispatchOutput(slot.buffer("expert_x", (1, cap, Hw), BF16, self.device), None,
                             slot.buffer("expert_num_tokens", (1,), torch.int32, self.device))
        slot.ata._dispatch(_BOTH, tmpl[:m], h._routing, None, m, out, h._rweights)
        self._claim(slot, _DISPATCHED)
        slot.m, slot.topk_idx, slot.weights = m, h._routing, h._rweights
        meta = out.expert_x[0][:, :4].view(torch.int32)
        valid = self._arange(cap) < out.expert_num_tokens
        keys = meta[:, 1].to(torch.int64) * M + meta[:, 0].to(torch.int64)
        n = h._sorted_keys.shape[0]
        pos = torch.searchsorted(h._sorted_keys, keys).clamp_(max=max(n - 1, 0))
        pieces = spec.split_fp32(topk_weights[:n]).reshape(n, 3 * K)
        y = torch.zeros((1, cap, Hw), dtype=BF16, device=self.device)
        if n:
            mine = torch.where(valid[:, None], pieces.index_select(0, pos), torch.zeros((), dtype=BF16, device=self.device))
            y[0, :, 4 + self.rank * 3 * K:4 + (self.rank + 1) * 3 * K] = mine
        back = torch.empty((m, Hw), dtype=BF16, device=self.device)
        slot.ata._combine(_BOTH, y, h._routing, None, m, back)
        slot.state = _FREE
        slot.topk_idx = slot.weights = None
        per_rank = spec.join_fp32(back[:, 4:4 + 3 * W * K].reshape(m, W, K, 3))
        total = torch.zeros((m, K), dtype=torch.float32, device=self.device)
        for r in range(W):
            total = total + per_rank[:, r]
        return total

    # DeepEP calls these itself above one NVLink domain; here they are the same calls.
    def internode_dispatch(self, *args, **kwargs):
        return self.dispatch(*args, **kwargs)

    def internode_combine(self, *args, **kwargs):
        return self.combine(*args, **kwargs)
