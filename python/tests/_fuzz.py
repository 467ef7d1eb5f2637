"""The fuzzer of epkit's Python surface (test_fuzz.py, marker fuzz).

Hypothesis draws one call and its arguments: shapes (empty ones too), dtypes, strides, devices,
non-contiguous views, NaN/Inf values, out-of-range expert ids, token counts above the bound and
wrong-sized outputs, as a valid base case plus at most one mutation. Every call must either

* compute the reference result (_moe_reference.py for the expert compute and the layer,
  _reference.py and the deep_ep cases for dispatch/combine), with the rows it must not write still
  holding their poison; or
* raise epkit.EpkitError whose message names the argument the mutation touched, having written
  nothing at all.

Nothing may be written out of bounds: every output lives inside a larger buffer poisoned with 0xA5
(Outputs), whose guard regions on both sides are compared after each call. A crash ends the process,
which the test (or its spawning parent) reports. Device-side violations (a device m above the rows,
a count above the capacity, an expert index >= E) must be clamped, computed for the rest, and
reported by check() naming what was wrong.

Each API's outcomes are counted (Report) and written as JSON into EPKIT_FUZZ_REPORT_DIR; conftest.py
merges them into fuzz-report.json (date, commit, GPU) and prints the table.
"""

import json
import math
import os
import time
from collections import Counter
from typing import Callable, Dict, List, Optional, Sequence

import torch

import _moe_reference as R

try:  # the CPU fuzz needs no compiled extension for its imports here
    import epkit
    EpkitError = epkit.EpkitError
except ImportError:  # pragma: no cover - test_fuzz.py skips without epkit
    epkit = None
    EpkitError = RuntimeError

FP8, BF16, FP16, F32 = torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32
I32, I64 = torch.int32, torch.int64
GUARD = 512          # bytes on each side of an output (a multiple of 256: the output keeps its alignment)
POISON = 0xA5
_U = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# =================================================================================================
# Outcomes
# =================================================================================================

class Report:
    """Outcome counts per API: "computed", "computed+reported" (a device-side violation clamped and
    raised by check()), "raised:<argument>"."""

    def __init__(self):
        self.counts: Dict[str, Counter] = {}

    def add(self, api: str, outcome: str) -> None:
        self.counts.setdefault(api, Counter())[outcome] += 1

    def write(self, name: str, extra: Optional[dict] = None) -> Optional[str]:
        d = os.environ.get("EPKIT_FUZZ_REPORT_DIR")
        if not d or not self.counts:
            return None
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"{name}-{os.getpid()}-{time.monotonic_ns()}.json")
        doc = {"name": name, "apis": {k: dict(v) for k, v in self.counts.items()}}
        doc.update(extra or {})
        with open(path, "w") as f:
            json.dump(doc, f)
        return path


REPORT = Report()


def esize(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class Outputs:
    """The outputs of one call, each inside its own poisoned buffer with GUARD bytes on each side.
    strided=True makes a non-contiguous view (every other column of a twice-as-wide region)."""

    def __init__(self, device):
        self.device = device
        self.bufs = []

    def new(self, shape, dtype, strided: bool = False) -> torch.Tensor:
        shape = tuple(int(s) for s in shape)
        n = math.prod(shape) * esize(dtype)
        span = 2 * n if strided else n
        buf = torch.full((span + 2 * GUARD,), POISON, dtype=torch.uint8, device=self.device)
        region = buf[GUARD:GUARD + span]
        if strided and len(shape) >= 1 and shape[-1] > 0:
            wide = shape[:-1] + (2 * shape[-1],)
            t = region.view(dtype).view(wide)[..., :shape[-1]]
        else:
            t = region.view(dtype).view(shape)
        self.bufs.append((buf, GUARD, GUARD + span))
        return t

    def guards_intact(self) -> bool:
        return all(bool((b[:lo] == POISON).all()) and bool((b[hi:] == POISON).all()) for b, lo, hi in self.bufs)

    def untouched(self) -> bool:
        return all(bool((b == POISON).all()) for b, _, _ in self.bufs)


def poisoned(t: torch.Tensor) -> bool:
    """Every byte of t (a contiguous slice of an Outputs tensor) still the poison."""
    if t.numel() == 0:
        return True
    return bool((t.contiguous().view(torch.uint8) == POISON).all())


def rowmajor(t: torch.Tensor) -> bool:
    """What epkit's bindings accept as contiguous: row-major strides, any stride on size-1 dims."""
    expected = 1
    for size, stride in zip(reversed(t.shape), reversed(t.stride())):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def same_f32(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bits, or both NaN (NaN payloads and signs are not specified)."""
    if a.shape != b.shape:
        return False
    a, b = a.float(), b.float()
    return bool(((R.bits(a) == R.bits(b)) | (torch.isnan(a) & torch.isnan(b))).all())


def same_fp8(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal e4m3 codes, or both NaN codes (0x7f / 0xff)."""
    if a.shape != b.shape:
        return False
    au, bu = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    return bool(((au == bu) | (((au & 0x7F) == 0x7F) & ((bu & 0x7F) == 0x7F))).all())


class Case:
    """One drawn call: its API, the mutation (None: a valid call) and the argument names a raise
    must mention (any one of them)."""

    def __init__(self, api: str, mutation: Optional[str], names: Sequence[str] = (), must_raise: bool = False):
        self.api, self.mutation, self.names, self.must_raise = api, mutation, tuple(names), must_raise

    def tag(self, **kw) -> str:
        return f"{self.api} mutation={self.mutation} " + " ".join(f"{k}={v}" for k, v in kw.items())


def run_call(case: Case, outs: Outputs, fn: Callable[[], object], check: Callable[[object], Optional[str]],
             tag: str, sync: Callable[[], None] = lambda: torch.cuda.synchronize(), err_type=None):
    """Runs fn, then: an EpkitError must name one of case.names and leave every output untouched; a
    result must come from a case that may compute, keep the guards intact and pass check (which
    returns the outcome label: "computed" or "computed+reported"). Any other exception propagates."""
    try:
        result = fn()
        sync()
    except (err_type or EpkitError) as e:
        sync()
        msg = str(e)
        assert case.names, f"{tag}: a valid call raised EpkitError: {msg}"
        hit = next((n for n in case.names if n in msg), None)
        assert hit is not None, f"{tag}: EpkitError does not name any of {list(case.names)}: {msg}"
        assert outs.untouched(), f"{tag}: raised ({msg}) but wrote an output first"
        REPORT.add(case.api, f"raised:{hit}")
        return None
    assert outs.guards_intact(), f"{tag}: wrote outside its outputs (a guard region changed)"
    assert not case.must_raise, f"{tag}: accepted {case.mutation}, which must raise naming {list(case.names)}"
    label = check(result) or "computed"
    REPORT.add(case.api, label)
    return result


def expect_reported(rec, expected: bool, names: Sequence[str], tag: str) -> str:
    """The ErrorRecord after a computed call: pending with a message naming one of `names` where a
    device-side violation was drawn, else clean."""
    if not expected:
        assert not rec.pending, f"{tag}: an unexpected device-side violation was recorded: {rec.message()}"
        return "computed"
    try:
        rec.check()
    except EpkitError as e:
        assert any(n in str(e) for n in names), f"{tag}: check() does not name any of {list(names)}: {e}"
        assert not rec.pending, f"{tag}: check() did not re-arm the record"
        return "computed+reported"
    raise AssertionError(f"{tag}: the device-side violation ({list(names)}) was not reported by check()")


# =================================================================================================
# Value generation (seeded torch generators on the CPU, then moved: the same on every machine)
# =================================================================================================

SPECIALS = (float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 3e38, -3e38, 1e-30)


def values(seed: int, shape, kind: str, scale: float = 2.0) -> torch.Tensor:
    """fp32 values on the CPU: "normal" N(0, scale), "ties" multiples of 0.5 in [-2, 2] (exact in bf16:
    equal scores are common), "special" normal with ~5% NaN/Inf/+-0/huge/tiny."""
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":
        return torch.randint(-4, 5, tuple(shape), generator=g).float() * 0.5
    v = torch.randn(tuple(shape), generator=g) * scale
    if kind == "special" and v.numel():
        where = torch.rand(tuple(shape), generator=g) < 0.05
        pick = torch.randint(0, len(SPECIALS), tuple(shape), generator=g)
        v = torch.where(where, torch.tensor(SPECIALS)[pick], v)
    return v


def fp8_codes(seed: int, shape, device) -> torch.Tensor:
    """Random finite e4m3 codes of magnitude <= 3.75 (as a float8_e4m3fn tensor)."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 1 << 16, tuple(shape), generator=g)
    code = ((r & 1) << 7) | (((r >> 1) % 9) << 3) | ((r >> 8) & 7)
    return code.to(torch.uint8).to(device).view(FP8)


def noncontig(t: torch.Tensor) -> torch.Tensor:
    """The same values as a non-row-major view (every other element of a twice-as-wide tensor)."""
    if t.dim() == 0 or t.shape[-1] == 0:
        return t
    wide = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=t.device)
    v = wide[..., ::2]
    v.copy_(t)
    return v


def device_count(v: int, device, dtype=I32, n: int = 1) -> torch.Tensor:
    return torch.full((n,), v, dtype=dtype, device=device)


# =================================================================================================
# epkit.route
# =================================================================================================

ROUTE_MUTATIONS = {
    # name: (argument names a raise may mention, must it raise)
    "logits_fp16": (("logits",), True),
    "logits_int32": (("logits",), True),
    "logits_noncontig": (("logits",), None),     # raises iff the view is not row-major
    "logits_cpu": (("logits",), True),
    "logits_cols": (("logits",), True),
    "idx_short": (("num_tokens", "rows", "topk_idx"), None),   # outputs with fewer rows: m is bounded by them
    "idx_k": (("topk_idx",), True),
    "idx_int64": (("topk_idx",), True),
    "weights_bf16": (("topk_weights",), True),
    "weights_noncontig": (("topk_weights",), None),
    "m_negative": (("num_tokens",), True),
    "m_above": (("num_tokens",), True),
    "m_dev_int64": (("num_tokens",), True),
    "m_dev_two": (("num_tokens",), True),
    "bias_shape": (("bias",), True),
    "bias_softmax": (("bias",), True),
    "bias_bf16": (("bias",), True),
    "cfg_topk": (("topk",), True),
    "cfg_groups": (("num_groups",), True),
    "cfg_scaling": (("routed_scaling",), True),
    "cfg_mode": (("mode",), True),
}


def route_strategy(st):
    @st.composite
    def draw(d):
        mode = d(st.sampled_from(["grouped_topk", "softmax_topk"]))
        if mode == "grouped_topk":
            G = d(st.sampled_from([1, 2, 4, 8]))
            gs = d(st.sampled_from([1, 2, 3, 4, 8, 16]))
            E, tg = G * gs, d(st.integers(1, G))
            K = d(st.integers(1, min(16, tg * gs)))
            renorm = True
        else:
            G = tg = 1
            E = d(st.integers(1, 80))
            K = d(st.integers(1, min(16, E)))
            renorm = d(st.booleans())
        c = dict(mode=mode, E=E, K=K, G=G, tg=tg, renorm=renorm,
                 scaling=d(st.sampled_from([1.0, 2.5, 0.75])),
                 rows=d(st.integers(0, 48)), dtype=d(st.sampled_from(["bf16", "fp32"])),
                 values=d(st.sampled_from(["normal", "ties", "special"])),
                 bias=mode == "grouped_topk" and d(st.booleans()),
                 m_kind=d(st.sampled_from(["none", "host", "device"])),
                 m_out=d(st.booleans()), out_given=d(st.booleans()), seed=d(st.integers(0, 2**31 - 1)),
                 mutation=d(st.sampled_from([None] * 12 + sorted(ROUTE_MUTATIONS))))
        c["m"] = d(st.integers(0, c["rows"] + (5 if c["m_kind"] == "device" else 0)))
        return c
    return draw()


def fuzz_route(c: dict, rec) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    mut = c["mutation"]
    E, K, rows = c["E"], c["K"], c["rows"]
    names, must = ROUTE_MUTATIONS.get(mut, ((), False))
    cfg = dict(mode=c["mode"], num_experts=E, topk=K, num_groups=c["G"], topk_groups=c["tg"],
               renormalize=c["renorm"], routed_scaling=c["scaling"])
    dt = BF16 if c["dtype"] == "bf16" else F32
    logits = values(c["seed"], (rows, E), c["values"]).to(dt).to(dev)
    bias = (values(c["seed"] + 1, (E,), "normal", 0.05).to(dev) if c["bias"] else None)
    outs = Outputs(dev)
    out_rows = rows
    if mut == "idx_short":
        out_rows = max(0, rows - 1 - c["seed"] % 3)
    m_kind, m = c["m_kind"], c["m"]
    # What the call computes: m is bounded by the smallest of the tensors' rows (the C++ check).
    eff_rows = min(rows, out_rows)
    num_tokens = None
    if m_kind == "host":
        num_tokens = min(m, rows)
    elif m_kind == "device":
        num_tokens = device_count(m, dev)
    host_m = rows if m_kind == "none" else (num_tokens if m_kind == "host" else None)
    # mutations
    if mut == "logits_fp16":
        logits = logits.to(FP16)
    elif mut == "logits_int32":
        logits = logits.float().nan_to_num(0.0).clamp(-100, 100).to(I32)
    elif mut == "logits_noncontig":
        logits = noncontig(logits)
        must = not rowmajor(logits)
    elif mut == "logits_cpu":
        logits = logits.cpu()
    elif mut == "logits_cols":
        logits = torch.cat([logits, logits[:, :1]], dim=1) if E else logits
    elif mut == "m_negative":
        num_tokens, host_m, m_kind = -1, -1, "host"
    elif mut == "m_above":
        num_tokens, host_m, m_kind = rows + 1 + c["seed"] % 4, None, "host"
    elif mut == "m_dev_int64":
        num_tokens, m_kind = device_count(min(m, rows), dev, I64), "device"
    elif mut == "m_dev_two":
        num_tokens, m_kind = device_count(min(m, rows), dev, I32, 2), "device"
    elif mut == "bias_shape":
        bias = torch.zeros(E + 1, device=dev)
        if c["mode"] == "softmax_topk":
            names = ("bias",)
    elif mut == "bias_softmax":
        if c["mode"] == "softmax_topk":
            bias = torch.zeros(E, device=dev)
        else:
            mut, names, must = None, (), False  # grouped top-k takes a bias: not a mutation here
    elif mut == "bias_bf16":
        bias = torch.zeros(E, dtype=BF16, device=dev)
        if c["mode"] == "softmax_topk":
            names = ("bias",)
    elif mut == "cfg_topk":
        cfg["topk"] = 17 if c["seed"] % 2 else 0
    elif mut == "cfg_groups":
        if E >= 2 and c["mode"] == "grouped_topk":
            cfg["num_groups"] = E + 1
        else:
            cfg["num_groups"] = 2  # softmax takes no groups
            names = ("num_groups", "topk_groups")
    elif mut == "cfg_scaling":
        cfg["routed_scaling"] = float("nan") if c["seed"] % 2 else 0.0
    elif mut == "cfg_mode":
        cfg["mode"] = "top2"
    if mut == "idx_short" and host_m is not None and host_m > out_rows:
        must = True
    elif mut == "idx_short":
        must = False
    idx = outs.new((out_rows, K + (1 if mut == "idx_k" else 0)), I64 if mut == "idx_int64" else I32)
    w = outs.new((out_rows, K), BF16 if mut == "weights_bf16" else F32, strided=mut == "weights_noncontig")
    if mut == "weights_noncontig":
        must = not rowmajor(w)
    m_out = outs.new((1,), I32) if c["m_out"] else None
    case = Case("route", mut, names, bool(must))
    if mut is None:
        case.names = ()
    tag = case.tag(mode=c["mode"], E=E, K=K, rows=rows, m_kind=m_kind, m=m, dtype=c["dtype"], values=c["values"],
                   seed=c["seed"])
    rec.reset()

    def call():
        return epkit.route(logits, epkit.RouterConfig(**cfg), bias=bias, num_tokens=num_tokens,
                           out=epkit.Routing(idx, w), num_tokens_out=m_out, error=rec)

    def check(_):
        dev_m = m_kind == "device"
        used = min(int(num_tokens.flatten()[0]), eff_rows) if dev_m else host_m
        ref_idx, ref_w = R.route(R.Router(c["mode"], E, K, c["G"], c["tg"], c["renorm"], c["scaling"]),
                                 logits[:used], bias)
        assert torch.equal(idx[:used].long(), ref_idx.long()), f"{tag}: topk_idx differs from the reference"
        if c["mode"] == "softmax_topk" and not c["renorm"]:
            tol = (2 * E + 4) * 2.0 ** -24
            a, b = w[:used], ref_w
            ok = (torch.isnan(a) & torch.isnan(b)) | ((a - b).abs() <= tol * b.abs())
            assert bool(ok.all()), f"{tag}: topk_weights beyond {tol:.3g} relative"
        else:
            assert same_f32(w[:used], ref_w), f"{tag}: topk_weights differ from the reference (bits)"
        assert poisoned(idx[used:]) and poisoned(w[used:]), f"{tag}: rows >= m = {used} written"
        if m_out is not None:
            assert int(m_out[0]) == used, f"{tag}: num_tokens_out = {int(m_out[0])}, expected {used}"
        return expect_reported(rec, dev_m and int(num_tokens.flatten()[0]) > eff_rows, ("num_tokens",), tag)

    run_call(case, outs, call, check, tag)


# =================================================================================================
# epkit.quantize
# =================================================================================================

QUANT_MUTATIONS = {
    "x_fp32": (("x",), True),
    "x_noncontig": (("x",), None),
    "x_cpu": (("x",), True),
    "h_not16": (("H", "x"), True),
    "q_bf16": (("out",), True),
    "q_wide": (("out",), True),
    "q_noncontig": (("out",), None),
    "scale_cols": (("scale",), True),
    "out_short": (("num_tokens", "rows", "out", "scale"), None),
    "m_negative": (("num_tokens",), True),
    "m_above": (("num_tokens",), True),
    "m_dev_int64": (("num_tokens",), True),
}


def quant_strategy(st):
    @st.composite
    def draw(d):
        c = dict(rows=d(st.integers(0, 40)), h=16 * d(st.integers(1, 80)), ue8m0=d(st.booleans()),
                 values=d(st.sampled_from(["normal", "special", "wide"])), m_kind=d(st.sampled_from(["none", "host", "device"])),
                 seed=d(st.integers(0, 2**31 - 1)), mutation=d(st.sampled_from([None] * 8 + sorted(QUANT_MUTATIONS))))
        c["m"] = d(st.integers(0, c["rows"] + (5 if c["m_kind"] == "device" else 0)))
        return c
    return draw()


def fuzz_quantize(c: dict, rec) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    mut = c["mutation"]
    rows, H = c["rows"], c["h"]
    names, must = QUANT_MUTATIONS.get(mut, ((), False))
    kind = "normal" if c["values"] == "wide" else c["values"]
    x = values(c["seed"], (rows, H), kind)
    if c["values"] == "wide":  # per-row spread of 2^[-20, 20], one all-zero block
        g = torch.Generator().manual_seed(c["seed"] + 7)
        x = x * (torch.rand(rows, 1, generator=g) * 40 - 20).exp2()
        if rows:
            x[0, :min(H, 128)] = 0
    x = x.to(BF16).to(dev)
    nb = (H + 127) // 128
    outs = Outputs(dev)
    q_rows = rows
    if mut == "out_short":
        q_rows = max(0, rows - 1 - c["seed"] % 3)
    m_kind, m = c["m_kind"], c["m"]
    num_tokens = None if m_kind == "none" else (min(m, rows) if m_kind == "host" else device_count(m, dev))
    host_m = rows if m_kind == "none" else (num_tokens if m_kind == "host" else None)
    if mut == "x_fp32":
        x = x.float()
    elif mut == "x_noncontig":
        x = noncontig(x)
        must = not rowmajor(x)
    elif mut == "x_cpu":
        x = x.cpu()
    elif mut == "h_not16":
        x = torch.zeros(rows, H + 8, dtype=BF16, device=dev)
        H = H + 8
        nb = (H + 127) // 128
    elif mut == "m_negative":
        num_tokens, host_m, m_kind = -1, -1, "host"
    elif mut == "m_above":
        num_tokens, host_m, m_kind = rows + 1 + c["seed"] % 4, None, "host"
    elif mut == "m_dev_int64":
        num_tokens, m_kind = device_count(min(m, rows), dev, I64), "device"
    eff_rows = min(rows, q_rows)
    if mut == "out_short":
        must = host_m is not None and host_m > q_rows
    q = outs.new((q_rows, H + (16 if mut == "q_wide" else 0)), BF16 if mut == "q_bf16" else FP8,
                 strided=mut == "q_noncontig")
    if mut == "q_noncontig":
        must = not rowmajor(q)
    scale = outs.new((q_rows, nb + (1 if mut == "scale_cols" else 0)), F32)
    case = Case("quantize", mut, names, bool(must))
    if mut is None:
        case.names = ()
    tag = case.tag(rows=rows, H=H, m_kind=m_kind, m=m, ue8m0=c["ue8m0"], values=c["values"], seed=c["seed"])
    rec.reset()

    def call():
        return epkit.quantize(x, ue8m0=c["ue8m0"], num_tokens=num_tokens, out=epkit.Quantized(q, scale), error=rec)

    def check(_):
        dev_m = m_kind == "device"
        used = min(int(num_tokens.flatten()[0]), eff_rows) if dev_m else host_m
        want_q, want_s = R.quantize(x[:used], c["ue8m0"])
        assert same_fp8(q[:used], want_q), f"{tag}: quantized bytes differ from the reference"
        assert same_f32(scale[:used], want_s), f"{tag}: scales differ from the reference"
        assert poisoned(q[used:]) and poisoned(scale[used:]), f"{tag}: rows >= m = {used} written"
        return expect_reported(rec, dev_m and int(num_tokens.flatten()[0]) > eff_rows, ("num_tokens", "quantize"), tag)

    run_call(case, outs, call, check, tag)


# =================================================================================================
# epkit.grouped_gemm
# =================================================================================================

GEMM_MUTATIONS = {
    "a_bf16": (("a",), True),
    "a_cpu": (("a",), True),
    "a_noncontig": (("a",), True),
    "a_scale_cols": (("a_scale",), True),
    "b_scale_rows": (("b_scale",), True),
    "counts_int64": (("expert_num_tokens",), True),
    "counts_len": (("expert_num_tokens",), True),
    "out_rows": (("out",), True),
    "out_fp16": (("out",), True),
    "offsets_len": (("expert_offsets",), True),
    "k_192": (("k", "K"), True),
    "count_above": (("capacity", "grouped_gemm"), False),   # device-side: clamped and reported
}


def gemm_strategy(st, configs: List[str]):
    @st.composite
    def draw(d):
        packed = d(st.booleans())
        c = dict(packed=packed, G=d(st.sampled_from([1, 3])), n=d(st.sampled_from([128, 200, 256])),
                 k=d(st.sampled_from([128, 256])), rows=d(st.sampled_from([8, 24, 40])),
                 config=d(st.sampled_from([None] + configs)), seed=d(st.integers(0, 2**31 - 1)),
                 mutation=d(st.sampled_from([None] * 8 + sorted(GEMM_MUTATIONS))))
        return c
    return draw()


def fuzz_grouped_gemm(c: dict, rec) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    mut = c["mutation"]
    if mut == "offsets_len" and not c["packed"]:
        mut = None
    names, must = GEMM_MUTATIONS.get(mut, ((), False))
    G, N, K, rows = c["G"], c["n"], c["k"], c["rows"]
    if mut == "k_192":
        K = 192
    g = torch.Generator().manual_seed(c["seed"])
    S = max(1, K // 128)
    R_ = G * rows  # packed rows
    # counts (and offsets, with gaps between groups)
    if c["packed"]:
        offsets, counts, start = [], [], 0
        for gi in range(G):
            start += int(torch.randint(0, 4, (1,), generator=g))
            room = max(0, (R_ - start) // (G - gi))
            cnt = int(torch.randint(0, room + 1, (1,), generator=g))
            offsets.append(min(start, R_))
            counts.append(cnt)
            start += cnt
        offsets.append(R_)
    else:
        counts = [int(v) for v in torch.randint(0, rows + 1, (G,), generator=g)]
        offsets = None
    over = None
    if mut == "count_above":
        over = int(torch.randint(0, G, (1,), generator=g))
        if c["packed"]:
            counts[over] = offsets[over + 1] - offsets[over] + 1 + int(torch.randint(0, 4, (1,), generator=g))
        else:
            counts[over] = rows + 1 + int(torch.randint(0, 4, (1,), generator=g))
    a_rows_shape = (R_, K) if c["packed"] else (G, rows, K)
    a = fp8_codes(c["seed"] + 1, a_rows_shape, dev)
    a_scale = (torch.rand(a_rows_shape[:-1] + (S,), generator=g) + 0.5).to(dev)
    b = fp8_codes(c["seed"] + 2, (G, N, K), dev)
    b_scale = (torch.rand(G, (N + 127) // 128, S, generator=g) * 0.1 + 0.01).to(dev)
    cnt = torch.tensor(counts, dtype=I32, device=dev)
    off = torch.tensor(offsets, dtype=I32, device=dev) if offsets is not None else None
    out_shape = ((R_, N) if c["packed"] else (G, rows, N))
    if mut == "a_bf16":
        a = a.float().to(BF16)
    elif mut == "a_cpu":
        a = a.cpu()
    elif mut == "a_noncontig":
        a = noncontig(a.view(torch.uint8)).view(FP8)
        must = not rowmajor(a)
    elif mut == "a_scale_cols":
        a_scale = torch.ones(a_rows_shape[:-1] + (S + 1,), device=dev)
    elif mut == "b_scale_rows":
        b_scale = torch.ones(G, (N + 127) // 128 + 1, S, device=dev)
    elif mut == "counts_int64":
        cnt = cnt.long()
    elif mut == "counts_len":
        cnt = torch.cat([cnt, cnt[:1]])
    elif mut == "out_rows":
        out_shape = (out_shape[0] + 1,) + out_shape[1:] if c["packed"] else (G, rows + 1, N)
    elif mut == "offsets_len":
        off = torch.cat([off, off[-1:]])
    outs = Outputs(dev)
    d_out = outs.new(out_shape, FP16 if mut == "out_fp16" else BF16)
    case = Case("grouped_gemm", mut, names, bool(must))
    if mut is None:
        case.names = ()
    tag = case.tag(packed=c["packed"], G=G, N=N, K=K, rows=rows, counts=counts, offsets=offsets, config=c["config"],
                   seed=c["seed"])
    rec.reset()

    def call():
        return epkit.grouped_gemm(a, a_scale, b, b_scale, cnt, off, out=d_out, config=c["config"], error=rec)

    def check(_):
        e2 = r2 = 0.0
        written = torch.zeros(out_shape[0] if c["packed"] else G * rows, dtype=torch.bool, device=dev)
        for gi in range(G):
            if c["packed"]:  # a group that does not fit before the next one (or R) is skipped whole
                lo = offsets[gi]
                n_ = 0 if gi == over else counts[gi]
                rows_y, rows_a, rows_s = d_out[lo:lo + n_], a[lo:lo + n_], a_scale[lo:lo + n_]
                written[lo:lo + n_] = True
            else:
                n_ = max(0, min(counts[gi], rows))
                rows_y, rows_a, rows_s = d_out[gi, :n_], a[gi, :n_], a_scale[gi, :n_]
                written[gi * rows:gi * rows + n_] = True
            if n_ == 0:
                continue
            ref, mag = R.gemm_rows(rows_a, rows_s, b[gi], b_scale[gi])
            y = rows_y.double()
            bad = (y - ref).abs() > 2.0 ** -7 * ref.abs() + 2.0 ** -10 * mag + 1e-30
            assert not bool(bad.any()), f"{tag}: group {gi}: {int(bad.sum())} elements out of tolerance"
            e2 += float(((y - ref) ** 2).sum())
            r2 += float((ref ** 2).sum())
        assert r2 == 0 or e2 <= (4e-3) ** 2 * r2, f"{tag}: relative Frobenius error {(e2 / r2) ** 0.5:.3g}"
        flat = d_out.view(-1, N)
        assert poisoned(flat[~written]), f"{tag}: rows outside the groups' counts were written"
        return expect_reported(rec, over is not None, ("capacity", "grouped_gemm", "packed"), tag)

    run_call(case, outs, call, check, tag)


# =================================================================================================
# epkit.silu_mul_quantize
# =================================================================================================

SILU_MUTATIONS = {
    "h_fp32": (("h",), True),
    "h_cpu": (("h",), True),
    "h_2i_200": (("h", "2I"), True),
    "h_noncontig": (("h",), None),
    "counts_int64": (("expert_num_tokens",), True),
    "counts_len": (("expert_num_tokens",), True),
    "q_cols": (("out",), True),
    "scale_cols": (("scale",), True),
    "packed_no_offsets": (("h",), True),
    "count_above": (("capacity", "silu_mul_quantize", "packed"), False),
}


def silu_strategy(st):
    @st.composite
    def draw(d):
        return dict(packed=d(st.booleans()), L=d(st.integers(1, 4)), cap=d(st.integers(1, 16)),
                    I=d(st.sampled_from([128, 256])), ue8m0=d(st.booleans()),
                    values=d(st.sampled_from(["normal", "special"])), seed=d(st.integers(0, 2**31 - 1)),
                    mutation=d(st.sampled_from([None] * 6 + sorted(SILU_MUTATIONS))))
    return draw()


def fuzz_silu(c: dict, rec) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    mut = c["mutation"]
    if mut == "packed_no_offsets" and not c["packed"]:
        mut = None
    names, must = SILU_MUTATIONS.get(mut, ((), False))
    L, cap, I = c["L"], c["cap"], c["I"]
    g = torch.Generator().manual_seed(c["seed"])
    Rr = L * cap
    if c["packed"]:
        offsets, counts, start = [], [], 0
        for e in range(L):
            start += int(torch.randint(0, 3, (1,), generator=g))
            room = max(0, (Rr - start) // (L - e))
            cnt = int(torch.randint(0, room + 1, (1,), generator=g))
            offsets.append(min(start, Rr))
            counts.append(cnt)
            start += cnt
        offsets.append(Rr)
        lead = (Rr,)
    else:
        counts = [int(v) for v in torch.randint(0, cap + 1, (L,), generator=g)]
        offsets = None
        lead = (L, cap)
    over = None
    if mut == "count_above":
        over = int(torch.randint(0, L, (1,), generator=g))
        counts[over] = (offsets[over + 1] - offsets[over] if c["packed"] else cap) + 1 + int(torch.randint(0, 3, (1,), generator=g))
    two_i = 2 * I
    h = (values(c["seed"] + 1, lead + (two_i,), c["values"], 3.0)).to(BF16).to(dev)
    cnt = torch.tensor(counts, dtype=I32, device=dev)
    off = torch.tensor(offsets, dtype=I32, device=dev) if offsets is not None else None
    qI = I
    if mut == "h_fp32":
        h = h.float()
    elif mut == "h_cpu":
        h = h.cpu()
    elif mut == "h_2i_200":
        h = torch.zeros(lead + (200,), dtype=BF16, device=dev)
        qI = 100
    elif mut == "h_noncontig":
        h = noncontig(h)
        must = not rowmajor(h)
    elif mut == "counts_int64":
        cnt = cnt.long()
    elif mut == "counts_len":
        cnt = torch.cat([cnt, cnt[:1]])
    elif mut == "packed_no_offsets":
        off = None
    outs = Outputs(dev)
    q = outs.new(lead + (qI + (128 if mut == "q_cols" else 0),), FP8)
    sc = outs.new(lead + (max(1, qI // 128) + (1 if mut == "scale_cols" else 0),), F32)
    case = Case("silu_mul_quantize", mut, names, bool(must))
    if mut is None:
        case.names = ()
    tag = case.tag(packed=c["packed"], L=L, cap=cap, I=I, counts=counts, offsets=offsets, ue8m0=c["ue8m0"],
                   values=c["values"], seed=c["seed"])
    rec.reset()

    def call():
        return epkit.silu_mul_quantize(h, cnt, off, ue8m0=c["ue8m0"], out=epkit.Quantized(q, sc), error=rec)

    def check(_):
        written = torch.zeros(math.prod(lead), dtype=torch.bool, device=dev)
        qf, sf = q.view(-1, qI), sc.view(-1, qI // 128)
        hf = h.reshape(-1, two_i)
        for e in range(L):
            if c["packed"]:  # a range that does not fit before the next one (or R) is skipped whole
                lo = offsets[e]
                n_ = 0 if e == over else counts[e]
            else:
                lo = e * cap
                n_ = max(0, min(counts[e], cap))
            if n_ == 0:
                continue
            want_q, want_s = R.silu_mul_quantize(hf[lo:lo + n_], c["ue8m0"])
            assert same_fp8(qf[lo:lo + n_], want_q), f"{tag}: expert {e}: quantized bytes differ"
            assert same_f32(sf[lo:lo + n_], want_s), f"{tag}: expert {e}: scales differ"
            written[lo:lo + n_] = True
        assert poisoned(qf[~written]) and poisoned(sf[~written]), f"{tag}: rows past the counts were written"
        return expect_reported(rec, over is not None, ("capacity", "silu_mul_quantize", "packed"), tag)

    run_call(case, outs, call, check, tag)


# =================================================================================================
# MoELayer.forward (world size 1, this process, no NVSHMEM)
# =================================================================================================

LAYER_MUTATIONS = {
    "x_above_bound": (("max_tokens_per_rank",), True),
    "x_fp32": (("x",), True),
    "x_noncontig": (("x",), None),
    "x_hidden": (("x",), True),
    "x_cpu": (("x",), True),
    "out_hidden": (("out",), True),
    "out_fp16": (("out",), True),
    "out_short": (("num_tokens", "rows"), None),
    "m_negative": (("num_tokens",), True),
    "m_above": (("num_tokens",), True),
    "nan_tokens": ((), False),   # valid: those tokens' rows are unspecified, every other row exact
}

_layers: Dict[tuple, object] = {}
_model = {}


def layer_strategy(st):
    @st.composite
    def draw(d):
        import _moe_cases as MC
        c = dict(schedule=d(st.sampled_from(["none", "dispatch_overlap", "microbatch"])),
                 layout=d(st.sampled_from(["masked", "packed"])), rows=d(st.integers(0, MC.MAX_TOKENS)),
                 m_kind=d(st.sampled_from(["none", "host", "device"])), out_given=d(st.booleans()),
                 seed=d(st.integers(0, 2**31 - 1)), mutation=d(st.sampled_from([None] * 6 + sorted(LAYER_MUTATIONS))))
        c["m"] = d(st.integers(0, c["rows"] + (4 if c["m_kind"] == "device" else 0)))
        return c
    return draw()


def _layer(schedule: str, layout: str):
    import _moe_cases as MC
    dev = torch.device("cuda", torch.cuda.current_device())
    if "md" not in _model:
        _model["md"] = MC.make_model(12345, MC.num_experts(1), dev)
    key = (schedule, layout)
    if key not in _layers:
        cfg = MC.config(1, 0, schedule=schedule, layout=layout)
        _layers[key] = epkit.MoELayer(cfg, **MC.layer_weights(_model["md"], 1, 0))
    return _layers[key], _model["md"]


def release_layers() -> None:
    for layer in _layers.values():
        layer.destroy()
    _layers.clear()
    _model.clear()


def check_layer_rows(layer, md, x, out, m, device_m, skip_rows, tag) -> None:
    """_moe_cases.check_forward, with rows holding NaN/Inf tokens left out of the output comparison
    (their rows are unspecified) and the routing compared NaN-aware."""
    import _moe_cases as MC
    rows = x.shape[0]
    logits, idx, w = (t.clone() for t in MC.layer_routing(layer, m, rows, device_m))
    cfg = layer.config
    ridx, rw = R.route(MC.router(cfg), logits, md["gate_bias"])
    assert torch.equal(idx.long(), ridx.long()), f"{tag}: layer topk_idx differs from the reference router"
    assert same_f32(w, rw), f"{tag}: layer topk_weights differ from the reference router"
    ref, refmag = MC.compose(md, x[:m], idx, w)
    keep = torch.ones(m, dtype=torch.bool, device=x.device)
    for r in skip_rows:
        if r < m:
            keep[r] = False
    got = out[:m].float()
    assert bool(torch.isfinite(got[keep]).all()), f"{tag}: non-finite output in a finite token's row"
    err2 = ((got - ref).double() ** 2).sum(1)[keep]
    mag2 = (refmag.double() ** 2).sum(1)[keep]
    bad = err2.sqrt() > MC.ROW_TOL * mag2.sqrt() + 1e-6
    assert not bool(bad.any()), f"{tag}: a row off by more than {MC.ROW_TOL} relative"
    if int(keep.sum()) >= 4:
        frob = float(err2.sum().sqrt() / mag2.sum().sqrt())
        assert frob <= MC.FROB_TOL, f"{tag}: relative Frobenius error {frob:.3g}"


def fuzz_layer(c: dict) -> None:
    import _moe_cases as MC
    dev = torch.device("cuda", torch.cuda.current_device())
    layer, md = _layer(c["schedule"], c["layout"])
    mut = c["mutation"]
    names, must = LAYER_MUTATIONS.get(mut, ((), False))
    H, M = MC.HIDDEN, MC.MAX_TOKENS
    rows = c["rows"]
    if mut == "x_above_bound":
        rows = M + 1 + c["seed"] % 4
    x = MC.tokens(c["seed"], rows, dev)
    skip = []
    if mut == "nan_tokens" and rows:
        g = torch.Generator().manual_seed(c["seed"])
        for r in torch.randperm(rows, generator=g)[:max(1, rows // 5)].tolist():
            x[r, int(torch.randint(0, H, (1,), generator=g))] = SPECIALS[r % 3]
            skip.append(r)
    out_rows = rows
    if mut == "out_short":
        out_rows = max(0, rows - 1 - c["seed"] % 3)
    m_kind, m = c["m_kind"], c["m"]
    num_tokens = None if m_kind == "none" else (min(m, rows) if m_kind == "host" else device_count(m, dev))
    host_m = rows if m_kind == "none" else (num_tokens if m_kind == "host" else None)
    out_hidden, out_dtype = H, BF16
    if mut == "x_fp32":
        x = x.float()
    elif mut == "x_noncontig":
        x = noncontig(x)
        must = not rowmajor(x)
    elif mut == "x_hidden":
        x = torch.zeros(rows, H + 128, dtype=BF16, device=dev)
    elif mut == "x_cpu":
        x = x.cpu()
    elif mut == "out_hidden":
        out_hidden = H + 128
    elif mut == "out_fp16":
        out_dtype = FP16
    elif mut == "m_negative":
        num_tokens, host_m, m_kind = -1, -1, "host"
    elif mut == "m_above":
        num_tokens, host_m, m_kind = rows + 1 + c["seed"] % 3, None, "host"
    eff_rows = min(rows, out_rows)
    if mut == "out_short":
        must = host_m is not None and host_m > out_rows
    outs = Outputs(dev)
    out = outs.new((out_rows, out_hidden), out_dtype)
    case = Case("MoELayer.forward", mut, names, bool(must))
    if mut in (None, "nan_tokens"):
        case.names = ()
    tag = case.tag(schedule=c["schedule"], layout=c["layout"], rows=rows, m_kind=m_kind, m=m, seed=c["seed"])

    def call():
        return layer.forward(x, out, num_tokens=num_tokens)

    def check(result):
        assert result is out, f"{tag}: forward did not return out"
        dev_m = m_kind == "device"
        used = min(int(num_tokens.flatten()[0]), eff_rows) if dev_m else host_m
        reported = dev_m and int(num_tokens.flatten()[0]) > eff_rows
        if reported:
            try:
                layer.check()
                raise AssertionError(f"{tag}: device m above the rows was not reported by check()")
            except EpkitError as e:
                assert "num_tokens" in str(e), f"{tag}: check() does not name num_tokens: {e}"
            layer.check()  # re-armed
        else:
            layer.check()
        # The layer's outputs and routing of [0, used), as the suite checks them.
        check_layer_rows(layer, md, x[:eff_rows] if dev_m else x, out, used, dev_m, skip, tag)
        assert poisoned(out[used:]), f"{tag}: rows >= m = {used} of out written"
        return "computed+reported" if reported else "computed"

    run_call(case, outs, call, check, tag)


# =================================================================================================
# epkit.AllToAll (native), world size 1 in this process
# =================================================================================================

A2A_MUTATIONS = {
    "x_fp32": (("x",), True),
    "x_hidden": (("x",), True),
    "x_noncontig": (("x",), None),
    "x_cpu": (("x",), True),
    "idx_float": (("topk_idx",), True),
    "idx_k": (("topk_idx",), True),
    "expert_x_rows": (("expert_x",), True),
    "counts_int64": (("expert_num_tokens",), True),
    "scale_missing": (("x_scale",), True),
    "m_above_bound": (("num_tokens", "max_tokens_per_rank"), True),
    "m_dev_above": (("num_tokens",), False),     # device-side: clamped and reported
    "idx_out_of_range": (("topk_idx", "expert"), False),   # device-side: skipped and reported
    "out_hidden": (("out",), True),
    "out_short": (("out", "num_tokens", "first dimension"), True),
    "weights_shape": (("topk_weights",), True),
    "expert_y_fp32": (("expert_y", "combine_in"), True),
}
_a2a_objects: Dict[tuple, object] = {}


def a2a_strategy(st):
    @st.composite
    def draw(d):
        payload = d(st.sampled_from(["bf16", "fp16", "fp8"]))
        c = dict(E=d(st.sampled_from([4, 8, 16])), H=d(st.sampled_from([64, 256, 1088])),
                 M=d(st.sampled_from([1, 8, 24])), payload=payload, cin=d(st.sampled_from(["bf16", "fp16"])),
                 cout=d(st.sampled_from(["bf16", "fp16"])), layout=d(st.sampled_from(["masked", "packed"])),
                 wad=d(st.booleans()), idx_dtype=d(st.sampled_from(["int32", "int64", "uint32"])),
                 device_m=d(st.booleans()), seed=d(st.integers(0, 2**31 - 1)),
                 mutation=d(st.sampled_from([None] * 8 + sorted(A2A_MUTATIONS))))
        c["K"] = d(st.integers(1, min(8, c["E"])))
        c["m"] = d(st.integers(0, c["M"]))
        return c
    return draw()


def _a2a(c):
    key = (c["E"], c["K"], c["H"], c["M"], c["payload"], c["layout"], c["wad"])
    if key not in _a2a_objects:
        while len(_a2a_objects) >= 12:  # bounded device memory over a long run: drop the oldest
            _a2a_objects.pop(next(iter(_a2a_objects))).destroy()
        dt = {"bf16": BF16, "fp16": FP16, "fp8": FP8}[c["payload"]]
        _a2a_objects[key] = epkit.AllToAll(num_experts=c["E"], topk=c["K"], hidden=c["H"], max_tokens_per_rank=c["M"],
                                           world_size=1, rank=0, dispatch_dtype=dt, layout=c["layout"],
                                           weights_at_dispatch=c["wad"])
    return _a2a_objects[key]


def release_all_to_all() -> None:
    for o in _a2a_objects.values():
        o.destroy()
    _a2a_objects.clear()


def fuzz_all_to_all(c: dict) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    ata = _a2a(c)
    mut = c["mutation"]
    if mut == "scale_missing" and c["payload"] != "fp8":
        mut = None
    if mut == "weights_shape" and c["wad"]:
        mut = None
    names, must = A2A_MUTATIONS.get(mut, ((), False))
    E, K, H, M = c["E"], c["K"], c["H"], c["M"]
    g = torch.Generator().manual_seed(c["seed"])
    m = c["m"]
    rows = M + 2 if mut == "m_above_bound" else min(M, m + c["seed"] % 3)  # x may have rows past m
    pdt = {"bf16": BF16, "fp16": FP16, "fp8": FP8}[c["payload"]]
    S = (H + 127) // 128
    if pdt == FP8:
        x = fp8_codes(c["seed"], (rows, H), dev)
        x_scale = (torch.rand(rows, S, generator=g) + 0.5).to(dev)
    else:
        x = (torch.randn(rows, H, generator=g) * 2).to(pdt).to(dev)
        x_scale = None
    idx = torch.rand(rows, E, generator=g).argsort(dim=1)[:, :K]
    masked = torch.rand(rows, K, generator=g) < 0.15
    idx = torch.where(masked, torch.full_like(idx, -1), idx)
    bad_entries = []
    if mut == "idx_out_of_range" and m > 0:
        t = int(torch.randint(0, m, (1,), generator=g))
        k = int(torch.randint(0, K, (1,), generator=g))
        idx[t, k] = E + int(torch.randint(0, 5, (1,), generator=g))
        bad_entries.append((t, k))
    w = torch.rand(rows, K, generator=g).to(dev)
    idx_dev = idx.to(dev)
    if c["idx_dtype"] == "int32":
        idx_t = idx_dev.to(I32)
    elif c["idx_dtype"] == "uint32":
        idx_t = idx_dev.to(I32).view(torch.uint32)
        if mut == "idx_out_of_range" or bool((idx < 0).any()):
            idx_t = idx_dev.to(I64)  # uint32 cannot hold -1 as "no expert" portably: use int64 here
    else:
        idx_t = idx_dev
    num_tokens = m
    dev_m_val = None
    if c["device_m"] or mut == "m_dev_above":
        dev_m_val = m + (1 + c["seed"] % 3 if mut == "m_dev_above" else 0)
        num_tokens = device_count(dev_m_val, dev)
    if mut == "m_above_bound":
        num_tokens = M + 1
    L = E
    outs = Outputs(dev)
    shape = ata.expert_shape()
    ex_shape = shape if mut != "expert_x_rows" else (shape[0] + 1,) + tuple(shape[1:])
    expert_x = outs.new(ex_shape, pdt)
    expert_x_scale = outs.new(ata.expert_shape(S), F32) if pdt == FP8 else None
    counts = outs.new((L,), I64 if mut == "counts_int64" else I32)
    offsets = outs.new((L + 1,), I32) if c["layout"] == "packed" else None
    xin, sin = x, x_scale
    if mut == "x_fp32":
        xin = x.float()
    elif mut == "x_hidden":
        xin = torch.zeros(rows, H + 16, dtype=x.dtype if x.dtype != FP8 else torch.uint8, device=dev)
        if x.dtype == FP8:
            xin = xin.view(FP8)
    elif mut == "x_noncontig":
        xin = noncontig(x.view(torch.uint8)).view(pdt) if pdt == FP8 else noncontig(x)
        must = not rowmajor(xin)
    elif mut == "x_cpu":
        xin = x.cpu()
    elif mut == "idx_float":
        idx_t = idx_dev.float()
    elif mut == "idx_k":
        idx_t = torch.cat([idx_dev, idx_dev[:, :1]], dim=1).to(I32)
    elif mut == "scale_missing":
        sin = None
    # The dispatch; a mutation of combine's arguments comes after a valid dispatch.
    combine_mut = mut in ("out_hidden", "out_short", "weights_shape", "expert_y_fp32")
    dcase = Case("AllToAll.dispatch", None if combine_mut else mut, () if combine_mut else names,
                 False if combine_mut else bool(must))
    if dcase.mutation in (None, "m_dev_above", "idx_out_of_range"):
        dcase.names = ()
    tag = dcase.tag(E=E, K=K, H=H, M=M, payload=c["payload"], layout=c["layout"], wad=c["wad"], m=m,
                    device_m=dev_m_val, idx=c["idx_dtype"], seed=c["seed"])
    dout = epkit.DispatchOutput(expert_x, expert_x_scale, counts, offsets)
    used = min(dev_m_val, rows, M) if dev_m_val is not None else m

    def dispatch():
        return ata.dispatch(xin, idx_t, sin, num_tokens=num_tokens, out=dout,
                            topk_weights=w if c["wad"] else None)

    def check_dispatch(_):
        valid = (idx[:used] >= 0) & (idx[:used] < E)
        cnts = counts.cpu().tolist()
        offs = offsets.cpu().tolist() if offsets is not None else None
        xb = x.view(torch.uint8) if pdt == FP8 else x.view(torch.int16)
        ex = expert_x.view(torch.uint8) if pdt == FP8 else expert_x.view(torch.int16)
        written = torch.zeros(expert_x.shape[0] * (expert_x.shape[1] if expert_x.dim() == 3 else 1),
                              dtype=torch.bool, device=dev)
        for e in range(E):
            toks = [t for t in range(used) for k in range(K) if bool(valid[t, k]) and int(idx[t, k]) == e]
            n_ = len(toks)
            assert cnts[e] == n_, f"{tag}: expert {e} received {cnts[e]} tokens, expected {n_}"
            if c["layout"] == "packed":
                assert offs[e + 1] - offs[e] >= n_ and offs[0] == 0, f"{tag}: expert_offsets {offs}"
                got = ex[offs[e]:offs[e] + n_]
                gs = expert_x_scale[offs[e]:offs[e] + n_] if expert_x_scale is not None else None
                written[offs[e]:offs[e] + n_] = True
            else:
                got = ex[e, :n_]
                gs = expert_x_scale[e, :n_] if expert_x_scale is not None else None
                written[e * ex.shape[1]:e * ex.shape[1] + n_] = True
            if n_ == 0:
                continue
            want = xb[toks]
            key = torch.linspace(1.0, 2.0, want.shape[1], dtype=torch.float64, device=dev).sin()
            pg, pw = torch.argsort(got.double() @ key), torch.argsort(want.double() @ key)
            assert torch.equal(got[pg], want[pw]), f"{tag}: expert {e}: rows differ from the tokens routed to it"
            if gs is not None:
                assert torch.equal(gs[pg], x_scale[toks][pw]), f"{tag}: expert {e}: scales differ"
        flat = ex.reshape(-1, ex.shape[-1])
        assert poisoned(flat[~written]), f"{tag}: expert_x rows beyond the placed ones were written"
        return "computed"

    # A device-side violation (a device m above min(M, rows), an expert index >= E) is clamped or
    # skipped, and reported when the layer is complete: by combine itself, after it launched.
    violation = (mut == "m_dev_above" and dev_m_val > min(rows, M)) or (mut == "idx_out_of_range" and bool(bad_entries))
    need = ("num_tokens",) if mut == "m_dev_above" else ("topk_idx", "expert")

    r = run_call(dcase, outs, dispatch, check_dispatch, tag)
    if r is None:
        return  # refused before launching: the object still expects a dispatch
    # The experts: y = dequant(x) * coef[e] in the combine-in dtype, rows past the counts NaN.
    cin = {"bf16": BF16, "fp16": FP16}[c["cin"]]
    coef = 0.5 + torch.arange(E, device=dev, dtype=F32) / E
    xf = expert_x.float()
    if expert_x_scale is not None:
        xf = xf * expert_x_scale.repeat_interleave(128, dim=-1)[..., :H]
    if c["layout"] == "packed":
        offs = offsets.tolist()
        y = torch.full(expert_x.shape, float("nan"), dtype=cin, device=dev)
        for e in range(E):
            n_ = int(counts[e])
            y[offs[e]:offs[e] + n_] = (xf[offs[e]:offs[e] + n_] * coef[e]).to(cin)
    else:
        y = (xf * coef[:, None, None]).to(cin)
        valid_rows = torch.arange(expert_x.shape[1], device=dev)[None, :] < counts[:, None]
        y = torch.where(valid_rows[..., None], y, torch.full_like(y, float("nan")))
    cout = {"bf16": BF16, "fp16": FP16}[c["cout"]]
    ccase = Case("AllToAll.combine", mut if combine_mut else None, names if combine_mut else (),
                 bool(must) if combine_mut else False)
    ctag = ccase.tag(E=E, K=K, H=H, payload=c["payload"], layout=c["layout"], wad=c["wad"], m=m, seed=c["seed"])
    couts = Outputs(dev)
    out_rows = max(rows, 1)
    if mut == "out_short":
        out_rows = max(0, used - 1)
        if used == 0 or c["device_m"]:
            ccase.must_raise, ccase.mutation, ccase.names = False, None, ()  # nothing to be short of
            out_rows = max(rows, 1)
    out = couts.new((out_rows, H + (16 if mut == "out_hidden" else 0)), cout)
    wts = None if c["wad"] else (torch.rand(rows, K + 1, device=dev) if mut == "weights_shape" else w)
    yin = y.float() if mut == "expert_y_fp32" else y

    def combine():
        return ata.combine(yin, idx_t, wts, num_tokens=num_tokens, out=out)

    def check_values():
        ref = torch.zeros(used, H, dtype=torch.float64, device=dev)
        mag = torch.zeros_like(ref)
        xq = x.float() if pdt != FP8 else x.float() * x_scale.repeat_interleave(128, dim=-1)[:, :H]
        for t in range(used):
            for k in range(K):
                e = int(idx[t, k])
                if 0 <= e < E:
                    yy = (xq[t] * coef[e]).to(cin).double()
                    ref[t] += float(w[t, k]) * yy
                    mag[t] += (float(w[t, k]) * yy).abs()
        got = out[:used].double()
        assert not bool(torch.isnan(got).any()), f"{ctag}: NaN in rows < m (a poisoned expert row was read)"
        rtol = 1e-2 if cout == BF16 else 2e-3
        bad = (got - ref).abs() > rtol * mag + 1e-6
        assert not bool(bad.any()), f"{ctag}: combine off at {int(bad.sum())} elements"
        assert poisoned(out[used:]), f"{ctag}: rows >= m written"

    if violation and not combine_mut:
        msg = None
        try:
            combine()
            torch.cuda.synchronize()
            ata.check()
        except EpkitError as e:
            torch.cuda.synchronize()
            msg = str(e)
        assert msg is not None, f"{ctag}: the device-side violation {mut} was not reported"
        assert any(n in msg for n in need), f"{ctag}: the report does not name any of {list(need)}: {msg}"
        assert couts.guards_intact(), f"{ctag}: wrote outside its output (a guard region changed)"
        check_values()
        ata.check()  # re-armed: nothing left
        REPORT.add("AllToAll.combine", "computed+reported")
        return

    def check_combine(_):
        check_values()
        ata.check()  # nothing was recorded
        return "computed"

    r2 = run_call(ccase, couts, combine, check_combine, ctag)
    if r2 is None:  # the combine was refused: complete the layer so that the object stays usable
        ata.combine(y, idx_t, None if c["wad"] else w, num_tokens=num_tokens,
                    out=torch.empty(max(rows, 1), H, dtype=cout, device=dev))
        torch.cuda.synchronize()
        ata.check()


# =================================================================================================
# CPU: what raises without a GPU (argument checks before any launch; configs)
# =================================================================================================

def cpu_strategy(st):
    @st.composite
    def draw(d):
        return dict(api=d(st.sampled_from(["route", "quantize", "quantize_weights", "grouped_gemm",
                                            "silu_mul_quantize", "AllToAllConfig", "MoELayerConfig", "RouterConfig",
                                            "AllToAll", "MoELayer", "pplx", "ErrorRecord"])),
                    rows=d(st.integers(0, 9)), cols=d(st.sampled_from([0, 1, 16, 100, 128, 256])),
                    dtype=d(st.sampled_from(["bf16", "fp16", "fp32", "int32", "int64", "uint8", "fp8"])),
                    ints=d(st.lists(st.integers(-3, 600), min_size=8, max_size=8)),
                    text=d(st.sampled_from(["masked", "packed", "none", "microbatch", "grouped_topk", "softmax_topk",
                                            "bogus", "auto", "portable"])),
                    plausible=d(st.booleans()), seed=d(st.integers(0, 2**31 - 1)))
    return draw()


_CPU_DT = {"bf16": BF16, "fp16": FP16, "fp32": F32, "int32": I32, "int64": I64, "uint8": torch.uint8, "fp8": FP8}


def fuzz_cpu(c: dict) -> None:
    """Every call with CPU tensors or random config values raises EpkitError (naming an argument or a
    field where the message is about one) and nothing else: no crash, no TypeError from the bindings."""
    t = torch.zeros(c["rows"], c["cols"], dtype=_CPU_DT[c["dtype"]])
    i = list(c["ints"])
    api = c["api"]
    if c.get("plausible"):  # values near valid configs, so that the valid path is taken too
        import random as _random
        rnd = _random.Random(c["seed"])
        if api == "MoELayerConfig":
            i = [rnd.choice([128, 512, 7168]), rnd.choice([128, 256, 2048]), rnd.choice([8, 16, 64, 256]),
                 rnd.choice([1, 2, 4, 8]), rnd.choice([1, 2, 24, 256]), rnd.choice([1, 2, 4, 8]), rnd.choice([1, 2, 4]), 0]
        else:
            i = [rnd.choice([8, 16, 64, 256]), rnd.choice([1, 2, 4, 8]), rnd.choice([128, 1088, 7168]),
                 rnd.choice([1, 8, 128]), 1, 0, 1, 0]
    names: Sequence[str] = ()
    if api == "route":
        fn = lambda: epkit.route(t, num_experts=max(1, i[0]), topk=i[1])  # noqa: E731
        names = ("logits", "topk", "num_experts", "mode")
    elif api == "quantize":
        fn = lambda: epkit.quantize(t, num_tokens=i[0] % 5)  # noqa: E731
        names = ("x",)
    elif api == "quantize_weights":
        fn = lambda: epkit.quantize_weights(t)  # noqa: E731
        names = ("w",)
    elif api == "grouped_gemm":
        fn = lambda: epkit.grouped_gemm(t[None], t, t[None], t[None], torch.zeros(1, dtype=I32))  # noqa: E731
        names = ("a", "b", "grouped_gemm", "k")
    elif api == "silu_mul_quantize":
        fn = lambda: epkit.silu_mul_quantize(t[None], torch.zeros(1, dtype=I32))  # noqa: E731
        names = ("h",)
    elif api == "AllToAllConfig":
        fn = lambda: epkit.AllToAllConfig(num_experts=i[0], topk=i[1], hidden=i[2], max_tokens_per_rank=i[3],  # noqa: E731
                                          world_size=max(1, i[4] % 9), rank=i[5] % 9, dp_size=i[6] % 5,
                                          layout=c["text"], capacity=i[7] % 7).validate()
        names = ("num_experts", "topk", "hidden", "max_tokens_per_rank", "world_size", "rank", "dp_size", "layout",
                 "capacity")
    elif api == "MoELayerConfig":
        fn = lambda: epkit.MoELayerConfig(hidden=i[0], intermediate=i[1], num_experts=i[2], topk=i[3],  # noqa: E731
                                          max_tokens_per_rank=i[4], world_size=1, rank=0, schedule=c["text"],
                                          num_groups=max(1, i[5] % 9), topk_groups=max(1, i[6] % 9)).validate()
        names = ("hidden", "intermediate", "num_experts", "topk", "max_tokens_per_rank", "schedule", "num_groups",
                 "topk_groups", "world_size", "routed_scaling", "num_shared")
    elif api == "RouterConfig":
        fn = lambda: epkit.RouterConfig(num_experts=i[0], topk=i[1], mode=c["text"], num_groups=i[2] % 9,  # noqa: E731
                                        topk_groups=i[3] % 9).validate()
        names = ("num_experts", "topk", "mode", "num_groups", "topk_groups")
    elif api == "AllToAll":
        if torch.cuda.is_available():  # a valid object would be made: not a CPU-surface case here
            REPORT.add("cpu:AllToAll", "skipped: a GPU is present")
            return
        # Valid configs too: without a GPU the object cannot be made (EpkitError, not a crash).
        fn = lambda: epkit.AllToAll(num_experts=8, topk=2, hidden=256, max_tokens_per_rank=max(1, i[0] % 64))  # noqa: E731
        names = ("CUDA", "cuda", "device", "max_tokens_per_rank")
    elif api == "MoELayer":
        fn = lambda: epkit.MoELayer(hidden=512, intermediate=256, num_experts=16, topk=4,  # noqa: E731
                                    max_tokens_per_rank=max(1, i[0] % 64), w13=t, w13_scale=t, w2=t, w2_scale=t, gate=t)
        names = ("w13", "CUDA", "cuda", "device")
    elif api == "pplx":
        fn = lambda: epkit.pplx.AllToAll.internode(max(1, i[0]), 8, 2, 0, 2, 1, 256, 256 * (1 + i[1] % 3),  # noqa: E731
                                                   i[2] % 16)
        names = ("nvshmem_init", "hidden_dim", "scale")
    else:
        fn = lambda: epkit.ErrorRecord(device="cpu")  # noqa: E731
        names = ("device",)
    try:
        fn()
    except EpkitError as e:
        assert any(n in str(e) for n in names), f"cpu {api} {c}: EpkitError names none of {names}: {e}"
        REPORT.add(f"cpu:{api}", "raised")
        return
    # Only config validation can pass on the CPU.
    assert api.endswith("Config"), f"cpu {api} {c}: returned without a GPU"
    REPORT.add(f"cpu:{api}", "valid")


# =================================================================================================
# The compatible APIs at world size 2 (spawned ranks: _harness.run_ranks). The parent draws the
# cases with hypothesis and every rank runs the same list, so the calls (and which of them raise
# before launching) match across ranks; each rank's tokens are its own, from the case's seed.
# =================================================================================================

PPLX_MUTATIONS = {
    "dp_x_fp32": (("dp_x",), True),
    "dp_x_noncontig": (("dp_x",), None),
    "indices_k": (("indices",), True),
    "out_expert_x_rows": (("out_expert_x",), True),
    "scale_missing": (("dp_x_scale",), True),
    "bound_m_int64": (("bound_m",), True),
    "m_above": (("num_tokens", "max_tokens_per_rank"), True),
    "out_tokens_hidden": (("out_tokens",), True),    # combine
    "weights_k": (("weights",), True),               # combine
    "expert_y_fp32": (("expert_y", "combine_in"), True),   # combine
}
_PPLX_COMBINE = ("out_tokens_hidden", "weights_k", "expert_y_fp32")


def pplx_strategy(st):
    @st.composite
    def draw(d):
        return dict(payload=d(st.sampled_from(["bf16", "fp16", "fp8"])), cin=d(st.sampled_from(["bf16", "fp16"])),
                    cout=d(st.sampled_from(["bf16", "fp16"])), device_m=d(st.booleans()), split=d(st.booleans()),
                    zero=d(st.integers(0, 9)) == 0, seed=d(st.integers(0, 2**31 - 1)),
                    mutation=d(st.sampled_from([None] * 8 + sorted(PPLX_MUTATIONS))))
    return draw()


def fuzz_pplx_ranks(rank, world_size, cases):
    """Runs on every rank (spawned): pplx.AllToAll dispatch + combine for each case."""
    import _cases as C
    from _reference import all_groups, check_combine, check_dispatch, expert_forward
    dev = torch.device("cuda", torch.cuda.current_device())
    dts = {"bf16": BF16, "fp16": FP16, "fp8": FP8}
    objs = {}
    for i, c in enumerate(cases):
        size = "fp8" if c["payload"] == "fp8" else "16-bit"
        if size not in objs:  # collective: same order on every rank (the cases are the same)
            objs[size] = C.pplx_all_to_all(C.combo_problem(world_size, 1, *C.COMBOS[size][0]), rank)
        ata = objs[size]
        p = C.combo_problem(world_size, 1, dts[c["payload"]], dts[c["cin"]], dts[c["cout"]])
        mut = c["mutation"]
        if mut == "scale_missing" and c["payload"] != "fp8":
            mut = None
        names, must = PPLX_MUTATIONS.get(mut, ((), False))
        groups = all_groups(p, c["seed"], dev, m=0 if c["zero"] else None)
        mine = groups[rank]
        x, x_scale, idx, w = mine.x, mine.x_scale, C.as_u32(mine.idx), mine.weights
        bound_m = None
        if c["device_m"]:
            x, x_scale, idx, w = C._padded(mine, p, p.max_tokens)
            bound_m = torch.tensor([mine.m], dtype=I32, device=dev).view(torch.uint32)
        L, Cap, S = p.num_local_experts, p.capacity, p.num_scales
        outs = Outputs(dev)
        ex = outs.new((L, Cap + (1 if mut == "out_expert_x_rows" else 0), p.hidden), p.payload)
        exs = outs.new((L, Cap, S), F32) if S else None
        cnt = outs.new((L,), I32)
        if mut == "dp_x_fp32":
            x = x.float()
        elif mut == "dp_x_noncontig":
            x = noncontig(x.view(torch.uint8)).view(FP8) if x.dtype == FP8 else noncontig(x)
            must = not rowmajor(x)
        elif mut == "indices_k":
            idx = torch.cat([idx.view(I32), idx.view(I32)[:, :1]], dim=1).view(torch.uint32)
        elif mut == "scale_missing":
            x_scale = None
        elif mut == "bound_m_int64":
            bound_m = torch.tensor([mine.m], dtype=I64, device=dev)
        elif mut == "m_above":  # one row more than max_tokens_per_rank, with host m
            big = torch.zeros(p.max_tokens + 1, p.hidden * x.element_size(), dtype=torch.uint8, device=dev)
            big[:x.shape[0]] = x.contiguous().view(torch.uint8)
            x = big.view(x.dtype)
            pad = torch.zeros(p.max_tokens + 1 - idx.shape[0], p.topk, dtype=I32, device=dev)
            idx = torch.cat([idx.view(I32), pad]).view(torch.uint32)
            if x_scale is not None:
                x_scale = torch.ones(p.max_tokens + 1, S, device=dev)
            bound_m = None
        combine_mut = mut in _PPLX_COMBINE
        dcase = Case("pplx.dispatch", None if combine_mut else mut, () if combine_mut or mut is None else names,
                     False if combine_mut else bool(must))
        tag = dcase.tag(case=i, rank=rank, payload=c["payload"], cin=c["cin"], cout=c["cout"], m=mine.m,
                        device_m=c["device_m"], split=c["split"], seed=c["seed"])

        def dispatch():
            kw = dict(out_expert_num_tokens=cnt, out_expert_x=ex, out_expert_x_scale=exs, dp_x=x, dp_x_scale=x_scale,
                      indices=idx, bound_m=bound_m)
            if c["split"]:
                ata.dispatch(**kw, do_send=True, do_recv=False)
                ata.dispatch(**kw, do_send=False, do_recv=True)
            else:
                ata.dispatch(**kw)

        def check_d(_):
            ata.impl.check()
            check_dispatch(p, rank, groups, cnt, ex, exs, tag)
            for el in range(L):
                assert poisoned(ex[el, int(cnt[el]):]), f"{tag}: expert {el}: rows past its count written"
            return "computed"

        if run_call(dcase, outs, dispatch, check_d, tag) is None:
            continue
        y = expert_forward(p, rank, ex, exs, cnt)
        couts = Outputs(dev)
        out = couts.new((p.max_tokens, p.hidden + (16 if mut == "out_tokens_hidden" else 0)), p.combine_out)
        wts = torch.cat([w, w[:, :1]], dim=1) if mut == "weights_k" else w
        yin = y.float() if mut == "expert_y_fp32" else y
        ccase = Case("pplx.combine", mut if combine_mut else None, names if combine_mut else (),
                     bool(must) if combine_mut else False)

        def combine():
            kw = dict(out_tokens=out, indices=idx, weights=wts, expert_y=yin, bound_m=bound_m)
            if c["split"]:
                ata.combine(**kw, do_send=True, do_recv=False)
                ata.combine(**kw, do_send=False, do_recv=True)
            else:
                ata.combine(**kw)

        def check_c(_):
            ata.impl.check()
            check_combine(p, mine, out, C.RTOL_OUT[p.combine_out], tag)
            assert poisoned(out[mine.m:]), f"{tag}: combine wrote rows >= m"
            return "computed"

        if run_call(ccase, couts, combine, check_c, tag) is None:  # complete the layer: the object stays usable
            ata.combine(torch.empty(p.max_tokens, p.hidden, dtype=p.combine_out, device=dev), idx, w, y, bound_m)
            torch.cuda.synchronize()
            ata.impl.check()
    for o in objs.values():
        o.destroy()
    if rank == 0:
        REPORT.write("pplx", {"world_size": world_size, "cases": len(cases)})


DEEP_EP_MUTATIONS = {
    "x_fp32": (("x",), True),
    "hidden_200": (("hidden",), True),
    "idx_int32": (("topk_idx",), True),
    "topk_17": (("top-k",), True),
    "m_above": (("num_max_dispatch_tokens_per_rank",), True),
    "idx_out_of_range": (("expert index",), True),
    "num_experts_odd": (("num_experts",), True),
    "ue8m0_no_round": (("round_scale",), True),
    "async_and_hook": (("async_finish", "return_recv_hook"), True),
    "stats_len": (("cumulative_local_expert_recv_stats",), True),
    "y_rows": (("x has shape",), True),          # combine
    "weights_f64": (("topk_weights",), True),    # combine
}
_DEEP_EP_COMBINE = ("y_rows", "weights_f64")


def deep_ep_strategy(st):
    @st.composite
    def draw(d):
        fp8 = d(st.booleans())
        round_scale = fp8 and d(st.booleans())
        return dict(hidden=d(st.sampled_from([128, 256, 384])), use_fp8=fp8, round_scale=round_scale,
                    ue8m0=round_scale and d(st.booleans()), mode=d(st.sampled_from(["fused", "hook", "async"])),
                    out_given=d(st.booleans()), m=d(st.sampled_from([[1], [7], [24], [0, 5], [3, 24, 1]])),
                    seed=d(st.integers(0, 2**31 - 1)),
                    mutation=d(st.sampled_from([None] * 8 + sorted(DEEP_EP_MUTATIONS))))
    return draw()


def deep_ep_fuzz_cases(env, rank, W, cases):
    """deep_ep.Buffer low-latency dispatch + combine per case (env: _deep_ep_cases.GpuEnv on the GPU,
    HostEnv on the host model, which checks these bodies without a GPU)."""
    import _deep_ep_cases as D
    E, M = 4 * W, D.LL_M
    L = E // W
    dev = env.device
    on_gpu = env.gpu
    buf = env.buffer(low_latency_mode=True, num_qps_per_rank=L)
    stats = torch.zeros(L, dtype=I32, device=dev)
    for i, c in enumerate(cases):
        mut = c["mutation"]
        names, must = DEEP_EP_MUTATIONS.get(mut, ((), False))
        H = c["hidden"]
        inputs = D._ll_inputs(c["seed"], i, W, E, H, M, which_m=c["m"])
        x, idx, w = inputs[rank]
        xd, idxd, wd = x.to(dev), idx.to(dev), w.to(dev)
        use_fp8, round_scale, ue8m0 = c["use_fp8"], c["round_scale"], c["ue8m0"]
        hook_mode, async_mode = c["mode"] == "hook", c["mode"] == "async"
        num_experts, st = E, stats
        if mut == "x_fp32":
            xd = xd.float()
        elif mut == "hidden_200":
            xd = torch.zeros(xd.shape[0], 200, dtype=BF16, device=dev)
        elif mut == "idx_int32":
            idxd = idxd.to(I32)
        elif mut == "topk_17":
            idxd = torch.zeros(xd.shape[0], 17, dtype=I64, device=dev)
        elif mut == "m_above":
            xd = torch.zeros(M + 1, H, dtype=BF16, device=dev)
            idxd = torch.zeros(M + 1, D.LL_K, dtype=I64, device=dev)
        elif mut == "idx_out_of_range":
            idxd = torch.full((max(1, xd.shape[0]), D.LL_K), -1, dtype=I64, device=dev)
            idxd[0, 0] = E + 3
            xd = torch.zeros(idxd.shape[0], H, dtype=BF16, device=dev)
        elif mut == "num_experts_odd":
            num_experts = E + 1
        elif mut == "ue8m0_no_round":
            use_fp8, round_scale, ue8m0 = True, False, True
        elif mut == "async_and_hook":
            hook_mode = async_mode = True
        elif mut == "stats_len":
            st = torch.zeros(L + 1, dtype=I32, device=dev)
        combine_mut = mut in _DEEP_EP_COMBINE
        tag = f"deep_ep case {i} rank={rank} H={H} fp8={use_fp8} round_scale={round_scale} ue8m0={ue8m0} " \
              f"{c['mode']} m={c['m']} mutation={mut} seed={c['seed']}"
        before = stats.cpu().clone()
        dcase = Case("deep_ep.low_latency_dispatch", None if combine_mut else mut,
                     () if combine_mut or mut is None else names, False if combine_mut else bool(must))
        douts = Outputs(dev) if on_gpu else _NoOutputs()
        got = {}

        def dispatch():
            got["r"] = buf.low_latency_dispatch(xd, idxd, M, num_experts, cumulative_local_expert_recv_stats=st,
                                                use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=ue8m0,
                                                async_finish=async_mode, return_recv_hook=hook_mode)
            recv, counts, handle, event, hook = got["r"]
            if hook_mode:
                hook()
            elif async_mode:
                event.current_stream_wait()
            return got["r"]

        def check_d(r):
            recv, counts, handle, _, _ = r
            D._ll_check_dispatch(tag, recv, counts, stats.cpu(), before, inputs, rank, W, E, H, use_fp8, round_scale,
                                 ue8m0)
            return "computed"

        sync = env.sync
        if run_call(dcase, douts, dispatch, check_d, tag, sync=sync, err_type=env.EpkitError) is None:
            assert torch.equal(stats.cpu(), before), f"{tag}: a refused dispatch changed the cumulative stats"
            env.barrier()
            continue
        recv, counts, handle, _, _ = got["r"]
        recv_x = recv[0] if use_fp8 else recv
        rows_scale = None
        if use_fp8:
            rows_scale = recv[1].float() if not ue8m0 else D._unpack_ue8m0(recv[1], H // 128)
        y = D._expert_y(recv_x, rows_scale, counts.cpu(), rank, L, use_fp8)
        couts = Outputs(dev) if on_gpu else _NoOutputs()
        out = couts.new((x.shape[0], H), BF16) if (c["out_given"] and on_gpu) else None
        yin = y[:, :-1].contiguous() if mut == "y_rows" else y
        win = wd.double() if mut == "weights_f64" else wd
        ccase = Case("deep_ep.low_latency_combine", mut if combine_mut else None, names if combine_mut else (),
                     bool(must) if combine_mut else False)

        def combine():
            res = buf.low_latency_combine(yin, idxd, win, handle, async_finish=async_mode and not hook_mode,
                                          return_recv_hook=hook_mode, out=out)
            combined, event, hook = res
            if hook_mode:
                hook()
            elif async_mode:
                event.current_stream_wait()
            got["out"] = combined
            return combined

        def check_c(combined):
            if out is not None:
                assert combined is out, f"{tag}: combine must write into out"
            D._ll_check_combine(tag, combined, x, idx, w, rank, W, E, use_fp8, round_scale)
            return "computed"

        if run_call(ccase, couts, combine, check_c, tag, sync=sync, err_type=env.EpkitError) is None:
            buf.low_latency_combine(y, idxd, wd, handle)  # complete the layer
            env.sync()
        env.barrier()
    if rank == 0:
        REPORT.write("deep_ep" if on_gpu else "deep_ep_host_model", {"world_size": W, "cases": len(cases)})


class _NoOutputs:
    """The host model's outputs are its own: nothing to guard there."""

    def guards_intact(self):
        return True

    def untouched(self):
        return True


def fuzz_deep_ep_ranks(rank, world_size, cases):
    import _deep_ep_cases as D
    deep_ep_fuzz_cases(D.GpuEnv(), rank, world_size, cases)
