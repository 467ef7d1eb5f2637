"""A host model of epkit.AllToAll, so that epkit.deep_ep's mapping (and the test bodies of
_deep_ep_cases.py) run without a GPU or the compiled extension.

It loads the real python/epkit/_deep_ep_spec.py and python/epkit/deep_ep.py into a separate package
(``epkit_host_model``, so an installed epkit is never shadowed) whose _lib, all_to_all, config, moe
and nvshmem modules are stand-ins, and runs W ranks as threads of this process. The stand-in
AllToAll implements the contract of include/epkit/all_to_all.hpp and docs/ARCHITECTURE.md, not the
kernels:

* dispatch places each (token, k) entry in its expert's rows, this rank's tokens first, then ranks
  rank + 1, ..., one contiguous run per source, in an order within each run that is shuffled (seeded)
  because epkit leaves it unspecified; expert_num_tokens counts them;
* combine returns, per token, the sum over the destination ranks (in the order of each rank's first
  top-k entry) of that rank's partial sum_k w * y in fp32 rounded to the output type, summed in fp32
  and rounded once: epkit's W >= 2 arithmetic (combine.cu);
* the protocol is enforced: dispatch, then combine, on one object; combine's topk_idx and m must be
  the dispatch's; ranks must create objects with the same config in the same order.

What it cannot show: anything about the kernels themselves (the GPU tests cover those).
"""

import contextlib
import importlib.util
import os
import random
import sys
import threading
import types
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

import _moe_reference as R

EPKIT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "epkit")
PACKAGE = "epkit_host_model"
_BOTH, _SEND, _RECV = 0, 1, 2
_tls = threading.local()


class EpkitError(RuntimeError):
    """The model's stand-in for epkit.EpkitError."""


# -- the world: ranks as threads ---------------------------------------------------------------------

class World:
    def __init__(self, world_size: int, seed: int, timeout_s: float = 60.0):
        self.W, self.seed, self.timeout_s = world_size, seed, timeout_s
        self.cond = threading.Condition()
        self.boxes = {}
        self.created = [0] * world_size
        self.failed = None

    def deposit(self, key, rank, value):
        with self.cond:
            self.boxes.setdefault(key, {})[rank] = value
            self.cond.notify_all()

    def collect(self, key):
        with self.cond:
            done = self.cond.wait_for(lambda: self.failed is not None or len(self.boxes.get(key, {})) == self.W,
                                      timeout=self.timeout_s)
            if self.failed is not None:
                raise RuntimeError(f"host model: another rank failed ({self.failed})")
            if not done:
                raise TimeoutError(f"host model: not every rank reached {key} in {self.timeout_s:.0f} s")
            return [self.boxes[key][r] for r in range(self.W)]

    def exchange(self, key, rank, value):
        self.deposit(key, rank, value)
        return self.collect(key)

    def fail(self, what):
        with self.cond:
            if self.failed is None:
                self.failed = what
            self.cond.notify_all()


def _world() -> World:
    return _tls.world


def _rank() -> int:
    return _tls.rank


class Comm:
    """The mpi4py-like communicator Buffer(None, comm=...) takes."""

    def Get_rank(self):
        return _rank()

    def Get_size(self):
        return _world().W

    def allgather(self, value):
        w = _world()
        n = getattr(_tls, "comm_calls", 0)
        _tls.comm_calls = n + 1
        return w.exchange(("comm", n), _rank(), value)

    def bcast(self, value, root=0):
        return self.allgather(value)[root]


# -- stand-ins of epkit's modules ------------------------------------------------------------------

class _C:
    @staticmethod
    def initialized():
        return True

    @staticmethod
    def my_pe():
        return _rank()

    @staticmethod
    def n_pes():
        return _world().W

    @staticmethod
    def device():
        return 0


class DispatchOutput(NamedTuple):
    expert_x: torch.Tensor
    expert_x_scale: Optional[torch.Tensor]
    expert_num_tokens: torch.Tensor
    expert_offsets: Optional[torch.Tensor] = None


@dataclass
class AllToAllConfig:
    num_experts: int
    topk: int
    hidden: int
    max_tokens_per_rank: int
    world_size: Optional[int] = None
    rank: Optional[int] = None
    dp_size: int = 1
    dispatch_dtype: torch.dtype = torch.bfloat16
    combine_in_dtype: torch.dtype = torch.bfloat16
    combine_out_dtype: torch.dtype = torch.bfloat16
    layout: str = "masked"
    capacity: int = 0
    packed_rows: int = 0
    packed_row_align: int = 1
    path: str = "auto"
    num_sms: int = 0
    timeout_ms: int = -1
    weights_at_dispatch: bool = False
    expert_scales_mn_major: bool = False


def _check(cond, msg):
    if not cond:
        raise EpkitError(msg)


class AllToAll:
    """The contract of epkit.AllToAll's masked layout, on the host."""

    def __init__(self, config: AllToAllConfig):
        c = config
        w = _world()
        _check(c.world_size == w.W and c.rank == _rank(), f"config world/rank {c.world_size}/{c.rank}")
        _check(1 <= c.topk <= 16, f"topk = {c.topk}")
        _check(c.topk <= c.num_experts, "topk > num_experts")
        _check(1 <= c.num_experts <= 4096 and c.num_experts % c.world_size == 0, f"num_experts = {c.num_experts}")
        _check(16 <= c.hidden <= 65536 and c.hidden % 16 == 0, f"hidden = {c.hidden}")
        _check(1 <= c.max_tokens_per_rank <= 65536, f"max_tokens_per_rank = {c.max_tokens_per_rank}")
        _check(c.dp_size == 1 and c.layout == "masked" and c.capacity == 0, "the model does dp 1, masked, default capacity")
        _check(c.path in ("auto", "portable") and 0 <= c.num_sms <= 1024, "path / num_sms")
        _check(not c.expert_scales_mn_major or c.dispatch_dtype == torch.float8_e4m3fn,
               "expert_scales_mn_major needs fp8")
        self.config = c
        self.index = w.created[c.rank]
        w.created[c.rank] += 1
        key = (c.num_experts, c.topk, c.hidden, c.max_tokens_per_rank, str(c.dispatch_dtype),
               str(c.combine_in_dtype), str(c.combine_out_dtype), c.path, c.num_sms, c.weights_at_dispatch)
        others = w.exchange(("create", self.index), c.rank, key)
        _check(all(o == key for o in others), f"ranks created object {self.index} with different configs: {others}")
        self.L = c.num_experts // c.world_size
        self.capacity = c.max_tokens_per_rank * c.world_size
        self.num_local_experts = self.L
        self.scales_per_token = (c.hidden + 127) // 128 if c.dispatch_dtype == torch.float8_e4m3fn else 0
        self.state, self.seq, self.alive = "free", 0, True
        self.failed = False  # the model has no device-side timeouts
        self.dispatched = None
        self.slot_of = {}
        self.dispatch_calls = self.combine_calls = 0

    @property
    def symmetric_bytes(self):
        return 0

    def expert_shape(self, inner=None):
        return (self.L, self.capacity, self.config.hidden if inner is None else inner)

    def check(self):
        pass

    def destroy(self):
        if self.alive:
            _world().exchange(("destroy", self.index), _rank(), None)
            self.alive = False

    # -- dispatch ---------------------------------------------------------------------------------
    def _dispatch(self, mode, x, topk_idx, x_scale, num_tokens, out: DispatchOutput, topk_weights):
        c, w, rank = self.config, _world(), _rank()
        _check(self.alive, "destroyed")
        K, H, M, L = c.topk, c.hidden, c.max_tokens_per_rank, self.L
        fp8 = c.dispatch_dtype == torch.float8_e4m3fn
        if mode in (_BOTH, _SEND):
            assert self.state == "free", f"protocol: dispatch on object {self.index} in state {self.state}"
            assert isinstance(num_tokens, int), "the model takes m on the host"
            m = num_tokens
            _check(x.dim() == 2 and x.shape[1] == H and x.is_contiguous(), f"x {tuple(x.shape)} (hidden {H})")
            _check(x.dtype == (torch.float8_e4m3fn if fp8 else x.dtype) and
                   (fp8 or x.dtype in (torch.bfloat16, torch.float16)), f"x dtype {x.dtype}")
            _check(topk_idx.dim() == 2 and topk_idx.shape[1] == K and topk_idx.is_contiguous(), "topk_idx")
            _check(topk_idx.dtype in (torch.int32, torch.int64), f"topk_idx dtype {topk_idx.dtype}")
            _check(0 <= m <= M and m <= x.shape[0] and m <= topk_idx.shape[0], f"m = {m}")
            if fp8:
                S = self.scales_per_token
                _check(x_scale is not None and x_scale.dtype == torch.float32 and x_scale.is_contiguous() and
                       x_scale.dim() == 2 and x_scale.shape[1] == S and x_scale.shape[0] >= m, "x_scale")
            else:
                _check(x_scale is None, "x_scale without fp8")
            if c.weights_at_dispatch:
                _check(topk_weights is not None and topk_weights.dtype == torch.float32 and
                       tuple(topk_weights.shape[1:]) == (K,) and topk_weights.shape[0] >= m, "weights at dispatch")
            else:
                _check(topk_weights is None, "topk_weights at dispatch without weights_at_dispatch")
            self.seq += 1
            self.dispatch_calls += 1
            payload = dict(x=x[:m].clone(), xs=None if x_scale is None else x_scale[:m].clone(),
                           idx=topk_idx[:m].to(torch.int64).clone(), m=m,
                           w=None if topk_weights is None else topk_weights[:m].clone())
            self.dispatched = payload
            w.deposit(("dispatch", self.index, self.seq), rank, payload)
            self.state = "dispatch_sent"
        if mode in (_BOTH, _RECV):
            assert self.state == "dispatch_sent", f"protocol: dispatch_recv in state {self.state}"
            src_data = w.collect(("dispatch", self.index, self.seq))
            ex, exs, cnt = out.expert_x, out.expert_x_scale, out.expert_num_tokens
            _check(tuple(ex.shape) == self.expert_shape() and ex.is_contiguous(), f"expert_x {tuple(ex.shape)}")
            _check(ex.dtype == self.dispatched["x"].dtype, "expert_x dtype is not x's")
            mn = c.expert_scales_mn_major  # each expert's scales [S, capacity]
            if fp8:
                S = self.scales_per_token
                shape = (L, S, self.capacity) if mn else (L, self.capacity, S)
                _check(exs is not None and tuple(exs.shape) == shape and
                       exs.dtype == torch.float32 and exs.is_contiguous(), f"expert_x_scale {tuple(exs.shape)}")
            _check(tuple(cnt.shape) == (L,) and cnt.dtype == torch.int32, "expert_num_tokens")
            self.slot_of = {}
            for el in range(L):
                e = rank * L + el
                slot = 0
                for j in range(w.W):
                    s = (rank + j) % w.W
                    d = src_data[s]
                    hits = (d["idx"] == e).nonzero().tolist()
                    random.Random(hash((w.seed, self.index, self.seq, rank, el, s))).shuffle(hits)
                    for t, k in hits:
                        if slot >= self.capacity:
                            break
                        ex[el, slot] = d["x"][t].to(ex.device)
                        if fp8 and mn:
                            exs[el, :, slot] = d["xs"][t].to(exs.device)
                        elif fp8:
                            exs[el, slot] = d["xs"][t].to(exs.device)
                        self.slot_of[(s, t, k)] = (el, slot)
                        slot += 1
                cnt[el] = slot
            self.state = "dispatched"

    # -- combine ----------------------------------------------------------------------------------
    def _combine(self, mode, expert_y, topk_idx, topk_weights, num_tokens, out):
        c, w, rank = self.config, _world(), _rank()
        K, H, L = c.topk, c.hidden, self.L
        if mode in (_BOTH, _SEND):
            assert self.state == "dispatched", f"protocol: combine on object {self.index} in state {self.state}"
            d = self.dispatched
            assert num_tokens == d["m"], f"protocol: combine m = {num_tokens}, dispatch m = {d['m']}"
            assert torch.equal(topk_idx[:d["m"]].to(torch.int64).cpu(), d["idx"].cpu()), \
                "protocol: combine's topk_idx is not the dispatch's"
            _check(tuple(expert_y.shape) == self.expert_shape() and expert_y.is_contiguous(), "expert_y shape")
            _check(expert_y.dtype in ((torch.bfloat16, torch.float16) if c.combine_in_dtype != torch.float32
                                      else (torch.float32,)), f"expert_y dtype {expert_y.dtype}")
            if c.weights_at_dispatch:
                _check(topk_weights is None, "topk_weights given to combine with weights_at_dispatch")
                wts = d["w"]
            else:
                _check(topk_weights is not None and topk_weights.dtype == torch.float32 and
                       tuple(topk_weights.shape[1:]) == (K,), "combine topk_weights")
                wts = topk_weights[:d["m"]].clone()
            _check(out is not None and out.dim() == 2 and out.shape[1] == H and out.shape[0] >= d["m"] and
                   out.dtype in (torch.bfloat16, torch.float16) and out.is_contiguous(), "out")
            self.combine_calls += 1
            self.pending = wts
            w.deposit(("combine", self.index, self.seq), rank, (expert_y.clone(), dict(self.slot_of)))
            self.state = "combine_sent"
        if mode in (_BOTH, _RECV):
            assert self.state == "combine_sent", f"protocol: combine_recv in state {self.state}"
            ys = w.collect(("combine", self.index, self.seq))
            d, wts = self.dispatched, self.pending
            for t in range(d["m"]):
                order = []
                for k in range(K):
                    e = int(d["idx"][t, k])
                    if 0 <= e < c.num_experts and e // L not in order:
                        order.append(e // L)
                total = torch.zeros(H, dtype=torch.float64)
                for r in order:
                    acc = torch.zeros(H, dtype=torch.float32)
                    y_r, slots = ys[r]
                    for k in range(K):
                        e = int(d["idx"][t, k])
                        if not (0 <= e < c.num_experts) or e // L != r:
                            continue
                        el, slot = slots[(rank, t, k)]
                        v = y_r[el, slot].double().cpu()
                        acc = (acc.double() + float(wts[t, k]) * v).float()  # fmaf: exact product, one rounding
                    partial = acc.to(out.dtype).double()
                    total = (total + partial).float().double()
                out[t] = total.float().to(out.dtype).to(out.device)
            self.state = "free"


class Quantized(NamedTuple):
    q: torch.Tensor
    scale: torch.Tensor


def quantize(x, *, ue8m0=False, num_tokens=None, out=None, error=None):
    q, s = R.quantize(x, ue8m0)
    return Quantized(q, s)


# -- the host runtime that replaces deep_ep's CUDA calls --------------------------------------------

class _Stream:
    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass


class _Event:
    def record(self, stream=None):
        pass


class HostRuntime:
    stream_obj = _Stream()

    @staticmethod
    def device():
        return torch.device("cpu")

    @staticmethod
    def current_device():
        return None

    @classmethod
    def current_stream(cls, device=None):
        return cls.stream_obj

    @staticmethod
    def new_stream(device):
        return _Stream()

    @staticmethod
    def new_event():
        return _Event()

    @staticmethod
    def stream(s):
        return contextlib.nullcontext()

    @staticmethod
    def capturing():
        return getattr(_tls, "capturing", False)

    @staticmethod
    def record_stream(t, s):
        pass


# -- loading ---------------------------------------------------------------------------------------

def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


_load_lock = threading.Lock()


def load():
    """The real deep_ep module on the host model (loaded once per process; thread-safe)."""
    with _load_lock:
        return _load_once()


def _load_once():
    if PACKAGE + ".deep_ep" in sys.modules:
        return sys.modules[PACKAGE + ".deep_ep"]
    pkg = types.ModuleType(PACKAGE)
    pkg.__path__ = [EPKIT_DIR]
    sys.modules[PACKAGE] = pkg
    lib = types.ModuleType(PACKAGE + "._lib")
    lib.EpkitError, lib._C = EpkitError, _C
    sys.modules[lib.__name__] = lib
    ata = types.ModuleType(PACKAGE + ".all_to_all")
    ata._BOTH, ata._SEND, ata._RECV = _BOTH, _SEND, _RECV
    ata.AllToAll, ata.DispatchOutput = AllToAll, DispatchOutput
    sys.modules[ata.__name__] = ata
    cfg = types.ModuleType(PACKAGE + ".config")
    cfg.AllToAllConfig = AllToAllConfig
    sys.modules[cfg.__name__] = cfg
    moe = types.ModuleType(PACKAGE + ".moe")
    moe.quantize = quantize
    sys.modules[moe.__name__] = moe
    nv = types.ModuleType(PACKAGE + ".nvshmem")

    def _no_nvshmem(*a, **k):
        raise EpkitError("the host model has no NVSHMEM")
    nv.nvshmem_alloc_empty_unique_id = nv.nvshmem_get_unique_id = nv.nvshmem_init = _no_nvshmem
    sys.modules[nv.__name__] = nv
    _load(PACKAGE + "._deep_ep_spec", os.path.join(EPKIT_DIR, "_deep_ep_spec.py"))
    dep = _load(PACKAGE + ".deep_ep", os.path.join(EPKIT_DIR, "deep_ep.py"))
    dep._rt = HostRuntime()
    return dep


def run_threads(world_size: int, fn, *args, seed: int = 0, timeout_s: float = 120.0):
    """fn(rank, world_size, *args) on world_size threads sharing one World; re-raises the first failure."""
    load()
    world = World(world_size, seed)
    errors = [None] * world_size

    def entry(rank):
        _tls.rank, _tls.world, _tls.comm_calls, _tls.capturing = rank, world, 0, False
        try:
            fn(rank, world_size, *args)
        except BaseException as e:  # noqa: BLE001 - reported below with the rank
            errors[rank] = e
            world.fail(f"rank {rank}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=entry, args=(r,), daemon=True) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
        if t.is_alive():
            world.fail("timeout")
            raise TimeoutError(f"{fn.__name__} on {world_size} host-model ranks did not finish in {timeout_s:.0f} s")
    # The first failure, not the "another rank failed" echoes it caused.
    primary = [e for e in errors if e is not None and not str(e).startswith("host model: another rank failed")]
    for e in primary or [e for e in errors if e is not None]:
        raise e


def set_capturing(flag: bool) -> None:
    _tls.capturing = flag
