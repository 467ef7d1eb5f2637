"""The MoE expert compute and MoELayer from Python (epkit.moe, epkit.MoELayer).

Host-only checks run wherever torch and epkit import. The GPU tests compare every op with a torch
reference (_moe_reference.py): the router (indices and weights exact, on inputs drawn from a small
set so that equal scores and equal group scores are common, under the documented tie rule),
quantization (bytes and scales exact), the grouped GEMM (against float64 products of the
dequantised operands, with the tolerance of tests/moe/test_grouped_gemm.cu), SiLU-mul + quantize
(bytes and scales exact); then torch.compile(fullgraph=True) and CUDA graph capture of the ops.
The layer runs in spawned ranks (_harness.run_ranks, with NVSHMEM): at W = 1 against a torch
composition of the same ops for every schedule, with its stage calls, errors, one CUDA graph for
every m and torch.compile of forward; at W = 2 through the harness.

Inputs are fresh each run: EPKIT_PY_SEED (default: random) seeds them and every failure names it.
"""

import os
import random

import pytest

torch = pytest.importorskip("torch", reason="epkit's Python tests need torch")
epkit = pytest.importorskip("epkit", reason="epkit is not installed: pip install --no-build-isolation --no-deps .",
                            exc_type=ImportError)

import _moe_reference as R  # noqa: E402

gpu = pytest.mark.gpu
stress = pytest.mark.stress
SEED = int(os.environ.get("EPKIT_PY_SEED") or random.SystemRandom().randrange(1 << 30))
FP8 = torch.float8_e4m3fn


def _gen(case: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(SEED * 1000 + case)


def _dev():
    return torch.device("cuda", torch.cuda.current_device())


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _poison(t: torch.Tensor, value=None) -> torch.Tensor:
    """Fills t's bits with `value` (an int of t's width), by default all ones: -1 for ints, NaN for
    floats. Outputs are poisoned before each launch so that rows a kernel must not write are seen."""
    v = t.view(_INT_VIEW[t.element_size()])
    v.fill_(value if value is not None else (255 if t.element_size() == 1 else -1))
    return t


def _untouched(t: torch.Tensor, value=None) -> bool:
    v = t.view(_INT_VIEW[t.element_size()])
    return bool((v == (value if value is not None else (255 if t.element_size() == 1 else -1))).all())


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool((R.bits(a) == R.bits(b)).all())


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _seed_msg(tag):
    return f"{tag} (EPKIT_PY_SEED={SEED})"


# -- host-only ---------------------------------------------------------------------------------

def _cpp_fields(obj):
    return {n for n in dir(obj) if not n.startswith("_") and not callable(getattr(obj, n))}


def test_moe_config_fields_are_the_cpp_fields():
    import dataclasses
    for py_cls, cpp in ((epkit.MoELayerConfig, epkit._C.MoELayerConfig()), (epkit.RouterConfig, epkit._C.RouterConfig())):
        py = {f.name for f in dataclasses.fields(py_cls)}
        assert py == _cpp_fields(cpp), f"{py_cls.__name__}: {py ^ _cpp_fields(cpp)}"
    cfg = epkit.MoELayerConfig(hidden=7168, intermediate=2048, num_experts=256, topk=8, max_tokens_per_rank=128,
                               num_groups=8, topk_groups=4, routed_scaling=2.5, num_shared_experts=1, world_size=8,
                               rank=3, dp_size=2, schedule="microbatch", layout="packed", ue8m0_scales=True,
                               shared_concurrent=False, expected_tokens=64, fused_gate_router=False)
    c = cfg.to_cpp()
    for name in ("hidden", "intermediate", "num_experts", "topk", "max_tokens_per_rank", "num_groups", "topk_groups",
                 "num_shared_experts", "world_size", "rank", "dp_size", "ue8m0_scales", "shared_concurrent",
                 "expected_tokens", "fused_gate_router"):
        assert getattr(c, name) == getattr(cfg, name), name
    assert c.routed_scaling == 2.5
    assert c.schedule == epkit.MoESchedule.microbatch and c.layout == epkit.ExpertLayout.packed
    assert c.router_mode == epkit.RouterMode.grouped_topk
    cfg.validate()
    assert cfg.num_local_experts == 32 and cfg.workspace_bytes > 0


def test_moe_config_validation_names_the_field():
    base = dict(hidden=512, intermediate=256, num_experts=16, topk=4, max_tokens_per_rank=8, world_size=1, rank=0)
    for over, needle in ((dict(hidden=500), "hidden"), (dict(intermediate=100), "intermediate"),
                         (dict(topk=17), "topk"), (dict(num_experts=15, world_size=2), "num_experts"),
                         (dict(schedule="microbatch", max_tokens_per_rank=1), "max_tokens_per_rank"),
                         (dict(num_shared_experts=2), "num_shared_experts")):
        with pytest.raises(epkit.EpkitError, match=needle):
            epkit.MoELayerConfig(**dict(base, **over)).validate()
    with pytest.raises(epkit.EpkitError, match="schedule"):
        epkit.MoELayerConfig(**dict(base, schedule="fast")).validate()
    with pytest.raises(epkit.EpkitError, match="num_groups"):
        epkit.RouterConfig(num_experts=16, topk=4, num_groups=3).validate()
    with pytest.raises(epkit.EpkitError, match="mode"):
        epkit.RouterConfig(num_experts=16, topk=4, mode="top2").validate()


def test_moe_ops_are_registered():
    """Every op is a torch custom op whose arguments avoid the names auto_functionalized or the out=
    conventions could take (`mode` broke fullgraph compilation with torch 2.11)."""
    assert epkit._moe_ops.UNAVAILABLE == "", epkit._moe_ops.UNAVAILABLE
    for name in ("moe_route", "moe_quantize", "moe_quantize_weights", "moe_grouped_gemm", "moe_silu_mul_quantize",
                 "moe_layer_forward"):
        schema = getattr(torch.ops.epkit, name).default._schema
        args = {a.name for a in schema.arguments}
        assert not args & {"mode", "out", "input", "self"}, f"{name}: {schema}"
        assert any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments), f"{name}: {schema}"
        assert len(schema.returns) == 0, f"{name} returns {schema.returns}"


def test_gemm_configs():
    names = epkit.available_gemm_configs()
    assert names and len(set(names)) == len(names)
    assert epkit.choose_gemm_config(32, 4096, 7168, rows=256, expected_m=8) in names
    with pytest.raises(epkit.EpkitError, match="k = 100"):
        epkit.choose_gemm_config(4, 256, 100, rows=64)


# -- router ------------------------------------------------------------------------------------

ROUTERS = {
    "deepseek": dict(mode="grouped_topk", num_experts=256, topk=8, num_groups=8, topk_groups=4, routed_scaling=2.5),
    "grouped-small": dict(mode="grouped_topk", num_experts=16, topk=4, num_groups=4, topk_groups=2, routed_scaling=2.5),
    "grouped-one-per-group": dict(mode="grouped_topk", num_experts=8, topk=2, num_groups=8, topk_groups=3),
    "mixtral": dict(mode="softmax_topk", num_experts=8, topk=2),
    "softmax-no-renorm": dict(mode="softmax_topk", num_experts=64, topk=6, renormalize=False),
    "softmax-scaled": dict(mode="softmax_topk", num_experts=33, topk=7, routed_scaling=0.75),
}


def _logits(g, rows, E, ties, dtype):
    if ties:  # {-2, -1.5, ..., 2}: exact in bf16; equal scores and equal group sums are common
        v = torch.randint(-4, 5, (rows, E), generator=g, device="cuda").float() * 0.5
    else:
        v = torch.randn(rows, E, generator=g, device="cuda") * 2
    return v.to(dtype)


@gpu
@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_route(name):
    kw = ROUTERS[name]
    cfg = epkit.RouterConfig(**kw)
    ref_cfg = R.Router(**kw)
    E, K = cfg.num_experts, cfg.topk
    # Softmax without renormalisation sums all E exponentials in an unspecified order: each order is
    # within (E - 1) 2^-24 relative, so two differ by < 2E 2^-24, plus the quotient's and the
    # scaling's roundings on each side (tests/moe/test_router.cu).
    tol = (2 * E + 4) * 2.0 ** -24 if (cfg.mode == "softmax_topk" and not cfg.renormalize) else 0.0
    case = 0
    for dtype in (torch.bfloat16, torch.float32):
        for ties in (True, False):
            for with_bias in ((False, True) if cfg.mode == "grouped_topk" else (False,)):
                case += 1
                g = _gen(100 * list(ROUTERS).index(name) + case)
                rows, m = 300, 297
                logits = _logits(g, rows, E, ties, dtype)
                bias = None
                if with_bias:
                    bias = ((torch.randint(0, 3, (E,), generator=g, device="cuda") * 0.125).float() if ties
                            else torch.randn(E, generator=g, device="cuda") * 0.05)
                out = epkit.Routing(_poison(torch.empty(rows, K, dtype=torch.int32, device="cuda")),
                                    _poison(torch.empty(rows, K, dtype=torch.float32, device="cuda")))
                got = epkit.route(logits, cfg, bias=bias, num_tokens=m, out=out)
                assert got is out
                torch.cuda.synchronize()
                want_idx, want_w = R.route(ref_cfg, logits[:m], bias)
                tag = _seed_msg(f"{name} {dtype} ties={ties} bias={with_bias}")
                assert torch.equal(out.topk_idx[:m], want_idx), f"{tag}: topk_idx"
                if tol:
                    rel = ((out.topk_weights[:m] - want_w).abs() / want_w.abs()).max()
                    assert float(rel) <= tol, f"{tag}: topk_weights relative error {float(rel):.3g} > {tol:.3g}"
                else:
                    assert _same_bits(out.topk_weights[:m], want_w), f"{tag}: topk_weights (bits)"
                assert _untouched(out.topk_idx[m:]) and _untouched(out.topk_weights[m:]), f"{tag}: rows >= m written"
    epkit.check_moe_errors()


@gpu
def test_route_device_m_and_errors():
    """m from a device count (and written to num_tokens_out); a device m above the rows is clamped
    and recorded in the ErrorRecord given; bad arguments raise before launching."""
    kw = ROUTERS["grouped-small"]
    cfg = epkit.RouterConfig(**kw)
    g = _gen(1)
    rows = 40
    logits = _logits(g, rows, cfg.num_experts, True, torch.float32)
    rec = epkit.ErrorRecord()
    m_dev = torch.tensor([17], dtype=torch.int32, device="cuda")
    m_out = torch.full((1,), -1, dtype=torch.int32, device="cuda")
    out = epkit.Routing(_poison(torch.empty(rows, 4, dtype=torch.int32, device="cuda")),
                        _poison(torch.empty(rows, 4, dtype=torch.float32, device="cuda")))
    epkit.route(logits, cfg, num_tokens=m_dev, num_tokens_out=m_out, out=out, error=rec)
    torch.cuda.synchronize()
    want_idx, want_w = R.route(R.Router(**kw), logits[:17])
    assert int(m_out) == 17 and not rec.pending
    assert torch.equal(out.topk_idx[:17], want_idx) and _same_bits(out.topk_weights[:17], want_w), _seed_msg("device m")
    assert _untouched(out.topk_idx[17:])
    m_dev.fill_(rows + 5)
    epkit.route(logits, cfg, num_tokens=m_dev, num_tokens_out=m_out, error=rec)
    torch.cuda.synchronize()
    assert int(m_out) == rows
    with pytest.raises(epkit.EpkitError, match="num_tokens_device holds m = 45"):
        rec.check()
    assert not rec.pending  # check() re-arms
    with pytest.raises(epkit.EpkitError, match="topk"):
        epkit.route(logits, num_experts=16, topk=17)
    with pytest.raises(epkit.EpkitError, match="bias"):  # softmax routing takes no bias
        epkit.route(logits, mode="softmax_topk", num_experts=16, topk=2, bias=torch.zeros(16, device="cuda"))
    with pytest.raises(epkit.EpkitError, match="CUDA"):
        epkit.route(logits.cpu(), cfg)
    epkit.check_moe_errors()


# -- quantization ------------------------------------------------------------------------------

def _activations(g, rows, h):
    """Rows of normal data with a per-row spread of 2^[-8, 8], one all-zero block and one tiny one."""
    x = torch.randn(rows, h, generator=g, device="cuda") * (torch.rand(rows, 1, generator=g, device="cuda") * 16 - 8).exp2()
    x[0, :min(h, 128)] = 0
    if rows > 1:
        x[1, :min(h, 128)] *= 1e-30
    return x.to(torch.bfloat16)


@gpu
def test_quantize():
    for case, (rows, h, ue8m0) in enumerate(((37, 512, False), (37, 512, True), (9, 7168, False), (6, 1040, False),
                                             (6, 1040, True))):
        x = _activations(_gen(200 + case), rows, h)
        m = rows - 2
        nb = (h + 127) // 128
        out = epkit.Quantized(_poison(torch.empty(rows, h, dtype=FP8, device="cuda")),
                              _poison(torch.empty(rows, nb, dtype=torch.float32, device="cuda")))
        epkit.quantize(x, ue8m0=ue8m0, num_tokens=m, out=out)
        full = epkit.quantize(x, ue8m0=ue8m0)
        torch.cuda.synchronize()
        want_q, want_s = R.quantize(x, ue8m0)
        tag = _seed_msg(f"quantize rows={rows} H={h} ue8m0={ue8m0}")
        assert _same_bytes(out.q[:m], want_q[:m]) and _same_bits(out.scale[:m], want_s[:m]), tag
        assert _untouched(out.q[m:]) and _untouched(out.scale[m:]), f"{tag}: rows >= m written"
        assert _same_bytes(full.q, want_q) and _same_bits(full.scale, want_s), f"{tag}: all rows"
        assert full.q.dtype == FP8 and full.scale.shape == (rows, nb)
    # m on the device, clamped and reported above the rows.
    x = _activations(_gen(210), 8, 256)
    rec = epkit.ErrorRecord()
    q = epkit.quantize(x, num_tokens=torch.tensor([3], dtype=torch.int32, device="cuda"), error=rec)
    epkit.quantize(x, num_tokens=torch.tensor([9], dtype=torch.int32, device="cuda"), error=rec)
    torch.cuda.synchronize()
    want_q, want_s = R.quantize(x)
    assert _same_bytes(q.q[:3], want_q[:3]) and _same_bits(q.scale[:3], want_s[:3])
    with pytest.raises(epkit.EpkitError, match="quantize"):
        rec.check()
    with pytest.raises(epkit.EpkitError, match="16"):
        epkit.quantize(torch.zeros(4, 40, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(epkit.EpkitError, match="bf16"):
        epkit.quantize(torch.zeros(4, 256, dtype=torch.float32, device="cuda"))
    epkit.check_moe_errors()


@gpu
def test_quantize_weights():
    for case, (shape, ue8m0) in enumerate((((256, 512), False), ((300, 200), False), ((300, 200), True),
                                           ((3, 384, 256), False), ((2, 130, 7168), True))):
        g = _gen(300 + case)
        w = (torch.randn(*shape, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
        got = epkit.quantize_weights(w, ue8m0=ue8m0)
        torch.cuda.synchronize()
        want_q, want_s = R.quantize_weights(w, ue8m0)
        tag = _seed_msg(f"quantize_weights {shape} ue8m0={ue8m0}")
        assert _same_bytes(got.q, want_q) and _same_bits(got.scale_inv, want_s), tag
    epkit.check_moe_errors()


# -- grouped GEMM ------------------------------------------------------------------------------

# Tolerance (tests/moe/test_grouped_gemm.cu): the operands are exact e4m3 codes times fp32 scales,
# the reference their float64 product; the kernel differs by its accumulation (each 128-deep K
# block in the tensor cores' reduced-precision fp32, ~14 mantissa bits, then promoted into fp32)
# and its bf16 output (2^-8 relative). So per element |y - r| <= 2^-7 |r| + 2^-10 sum_k |a_k b_k|,
# and over a case ||y - r||_F <= 4e-3 ||r||_F (2.5x the rounding's RMS of 1.5e-3).
def _check_gemm_rows(got, a, a_scale, b, b_scale, tag):
    ref, mag = R.gemm_rows(a, a_scale, b, b_scale)
    y = got.double()
    bad = (y - ref).abs() > 2.0 ** -7 * ref.abs() + 2.0 ** -10 * mag + 1e-30
    assert not bad.any(), f"{tag}: {int(bad.sum())} elements out of tolerance, first at {bad.nonzero()[0].tolist()}"
    return float(((y - ref) ** 2).sum()), float((ref ** 2).sum())


def _gemm_operands(g, G, n, k, a_rows):
    a = epkit.quantize(_activations(g, a_rows, k))
    w = torch.randn(G, n, k, generator=g, device="cuda") * 0.05
    w = w * (torch.rand(G, (n + 127) // 128, 1, k // 128, 1, generator=g, device="cuda") * 6 - 3).exp2() \
        .expand(G, (n + 127) // 128, 128, k // 128, 128).reshape(G, -1, k)[:, :n]
    b = epkit.quantize_weights(w.to(torch.bfloat16))
    return a, b


def _masked_case(case, G, n, k, rows, config=None, expected_m=0):
    g = _gen(case)
    a, b = _gemm_operands(g, G, n, k, G * rows)
    counts = [0, rows] + [int(c) for c in torch.randint(1, rows + 1, (G - 2,), generator=g, device="cuda")]
    counts = [counts[i] for i in torch.randperm(G, generator=g, device="cuda").tolist()]
    cnt = torch.tensor(counts, dtype=torch.int32, device="cuda")
    aq, asc = a.q.view(G, rows, k), a.scale.view(G, rows, k // 128)
    d = _poison(torch.empty(G, rows, n, dtype=torch.bfloat16, device="cuda"))
    got = epkit.grouped_gemm(aq, asc, b.q, b.scale_inv, cnt, out=d, config=config, expected_m=expected_m)
    assert got is d
    torch.cuda.synchronize()
    tag = _seed_msg(f"grouped_gemm masked G={G} n={n} k={k} rows={rows} counts={counts} config={config}")
    e2 = r2 = 0.0
    for gi, c in enumerate(counts):
        e, r = _check_gemm_rows(d[gi, :c], aq[gi, :c], asc[gi, :c], b.q[gi], b.scale_inv[gi], f"{tag} group {gi}")
        e2, r2 = e2 + e, r2 + r
        assert _untouched(d[gi, c:]), f"{tag}: rows past count of group {gi} written"
    assert e2 <= (4e-3) ** 2 * r2, f"{tag}: relative Frobenius error {(e2 / r2) ** 0.5:.3g} > 4e-3"
    if config is not None:  # an explicit GroupedGemm of the same config computes the same bits
        obj = epkit.GroupedGemm(G, n, k, rows, config=config)
        assert obj.config == config and obj.workspace_bytes > 0
        d2 = obj.run(aq, asc, b.q, b.scale_inv, cnt)
        torch.cuda.synchronize()
        for gi, c in enumerate(counts):
            assert _same_bytes(d2[gi, :c], d[gi, :c]), f"{tag}: epkit.GroupedGemm.run differs, group {gi}"


@gpu
def test_grouped_gemm_masked_every_config():
    for i, cfg in enumerate(epkit.available_gemm_configs()):
        _masked_case(400 + i, G=4, n=384, k=512, rows=64, config=cfg)
    _masked_case(410, G=5, n=264, k=384, rows=40)  # the heuristic's choice; n % 128 != 0
    epkit.check_moe_errors()


@gpu
def test_grouped_gemm_deepseek_shape():
    """DeepSeek-V3's up/gate projection (n 4096, k 7168) at decode-like rows per expert."""
    _masked_case(420, G=2, n=4096, k=7168, rows=8, expected_m=4)
    epkit.check_moe_errors()


@gpu
def test_grouped_gemm_packed():
    g = _gen(430)
    G, n, k, R_ = 3, 256, 512, 160
    a, b = _gemm_operands(g, G, n, k, R_)
    offsets, counts, start = [], [], 0
    for gi in range(G):  # random gaps between the groups' blocks; the rows in them stay untouched
        start += int(torch.randint(0, 9, (1,), generator=g, device="cuda"))
        room = (R_ - start) // (G - gi)
        c = int(torch.randint(0, room + 1, (1,), generator=g, device="cuda")) if gi else room
        offsets.append(start)
        counts.append(c)
        start += c
    offsets.append(R_)
    cnt = torch.tensor(counts, dtype=torch.int32, device="cuda")
    off = torch.tensor(offsets, dtype=torch.int32, device="cuda")
    d = _poison(torch.empty(R_, n, dtype=torch.bfloat16, device="cuda"))
    epkit.grouped_gemm(a.q, a.scale, b.q, b.scale_inv, cnt, off, out=d)
    torch.cuda.synchronize()
    tag = _seed_msg(f"grouped_gemm packed offsets={offsets} counts={counts}")
    written = torch.zeros(R_, dtype=torch.bool, device="cuda")
    for gi in range(G):
        r0, r1 = offsets[gi], offsets[gi] + counts[gi]
        _check_gemm_rows(d[r0:r1], a.q[r0:r1], a.scale[r0:r1], b.q[gi], b.scale_inv[gi], f"{tag} group {gi}")
        written[r0:r1] = True
    assert _untouched(d[~written]), f"{tag}: rows outside the groups written"
    epkit.check_moe_errors()


@gpu
def test_grouped_gemm_count_above_capacity_is_clamped_and_reported():
    g = _gen(440)
    G, n, k, rows = 2, 128, 256, 16
    a, b = _gemm_operands(g, G, n, k, G * rows)
    aq, asc = a.q.view(G, rows, k), a.scale.view(G, rows, k // 128)
    rec = epkit.ErrorRecord()
    d = _poison(torch.empty(G, rows, n, dtype=torch.bfloat16, device="cuda"))
    epkit.grouped_gemm(aq, asc, b.q, b.scale_inv, torch.tensor([rows + 5, 3], dtype=torch.int32, device="cuda"), out=d,
                       error=rec)
    torch.cuda.synchronize()
    _check_gemm_rows(d[0], aq[0], asc[0], b.q[0], b.scale_inv[0], _seed_msg("clamped group"))
    with pytest.raises(epkit.EpkitError, match="exceeds the capacity"):
        rec.check()
    with pytest.raises(epkit.EpkitError, match="b_scale"):
        epkit.grouped_gemm(aq, asc, b.q, b.scale_inv[:, :, :1].contiguous(), torch.zeros(G, dtype=torch.int32,
                                                                                        device="cuda"))
    epkit.check_moe_errors()


# -- SiLU-mul + quantization -------------------------------------------------------------------

def _gate_up(g, rows, i):
    """[rows, 2I] bf16, each 128-block one of: zeros, normal(0, 3), magnitudes 2^U(-20, 20), ~1e15
    (h stays finite), all negative."""
    base = torch.randn(rows, 2 * i, generator=g, device="cuda") * 3
    kind = torch.randint(0, 5, (rows, 2 * i // 128), generator=g, device="cuda").repeat_interleave(128, 1)
    mag = (torch.rand(rows, 2 * i, generator=g, device="cuda") * 40 - 20).exp2() * base.sign()
    v = torch.where(kind == 0, torch.zeros_like(base), base)
    v = torch.where(kind == 2, mag, v)
    v = torch.where(kind == 3, base * 1e15, v)
    v = torch.where(kind == 4, -base.abs(), v)
    return v.to(torch.bfloat16)


@gpu
def test_silu_mul_quantize():
    for case, (L, cap, i, ue8m0) in enumerate(((3, 16, 256, False), (4, 9, 384, True), (2, 5, 2048, False))):
        g = _gen(500 + case)
        h = _gate_up(g, L * cap, i).view(L, cap, 2 * i)
        counts = [0, cap] + [int(c) for c in torch.randint(1, cap + 1, (L - 2,), generator=g, device="cuda")]
        cnt = torch.tensor(counts, dtype=torch.int32, device="cuda")
        out = epkit.Quantized(_poison(torch.empty(L, cap, i, dtype=FP8, device="cuda")),
                              _poison(torch.empty(L, cap, i // 128, dtype=torch.float32, device="cuda")))
        epkit.silu_mul_quantize(h, cnt, ue8m0=ue8m0, out=out)
        torch.cuda.synchronize()
        tag = _seed_msg(f"silu_mul_quantize masked L={L} cap={cap} I={i} ue8m0={ue8m0} counts={counts}")
        for e, c in enumerate(counts):
            want_q, want_s = R.silu_mul_quantize(h[e, :c], ue8m0)
            assert _same_bytes(out.q[e, :c], want_q) and _same_bits(out.scale[e, :c], want_s), f"{tag}: expert {e}"
            assert _untouched(out.q[e, c:]) and _untouched(out.scale[e, c:]), f"{tag}: rows past count {e} written"
    # Packed, with rows between the experts' blocks that must stay untouched.
    g = _gen(510)
    i, R_ = 256, 40
    offsets, counts = [0, 12, 20, 40], [10, 0, 17]
    h = _gate_up(g, R_, i)
    out = epkit.Quantized(_poison(torch.empty(R_, i, dtype=FP8, device="cuda")),
                          _poison(torch.empty(R_, i // 128, dtype=torch.float32, device="cuda")))
    epkit.silu_mul_quantize(h, torch.tensor(counts, dtype=torch.int32, device="cuda"),
                            torch.tensor(offsets, dtype=torch.int32, device="cuda"), out=out)
    torch.cuda.synchronize()
    written = torch.zeros(R_, dtype=torch.bool, device="cuda")
    for e in range(3):
        r0, r1 = offsets[e], offsets[e] + counts[e]
        want_q, want_s = R.silu_mul_quantize(h[r0:r1])
        assert _same_bytes(out.q[r0:r1], want_q) and _same_bits(out.scale[r0:r1], want_s), _seed_msg(f"packed {e}")
        written[r0:r1] = True
    assert _untouched(out.q[~written]) and _untouched(out.scale[~written]), _seed_msg("packed: gaps written")
    # A count above the capacity: the first cap rows are computed, the violation recorded.
    rec = epkit.ErrorRecord()
    hm = h[:16].view(2, 8, 2 * i)
    q = epkit.silu_mul_quantize(hm, torch.tensor([9, 8], dtype=torch.int32, device="cuda"), error=rec)
    torch.cuda.synchronize()
    want_q, want_s = R.silu_mul_quantize(hm[0])
    assert _same_bytes(q.q[0], want_q) and _same_bits(q.scale[0], want_s)
    with pytest.raises(epkit.EpkitError, match="exceeds the capacity"):
        rec.check()
    epkit.check_moe_errors()


# -- gate projection ---------------------------------------------------------------------------

@gpu
def test_gate_projection():
    g = _gen(600)
    H, E, M = 512, 16, 24
    gate = epkit.GateProjection(H, E, M)
    x = torch.randn(M, H, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(E, H, generator=g, device="cuda") * 0.1).to(torch.bfloat16)
    out = _poison(torch.empty(M, E, dtype=torch.float32, device="cuda"))
    gate(x, w, out, num_tokens=19)
    torch.cuda.synchronize()
    want = x[:19].double() @ w.double().T
    mag = x[:19].double().abs() @ w.double().abs().T
    # bf16 inputs are exact; fp32 accumulation over H terms.
    assert bool(((out[:19].double() - want).abs() <= 1e-5 * mag + 1e-6).all()), _seed_msg("gate logits")
    assert _untouched(out[19:])
    with pytest.raises(epkit.EpkitError, match="max_tokens|m ="):
        gate(torch.zeros(M + 1, H, dtype=torch.bfloat16, device="cuda"), w)


# -- torch.compile and CUDA graphs -------------------------------------------------------------

def _pipeline(x, logits, bias, counts, w13, w2, cfg):
    """route, quantize, up/gate GEMM, SiLU-mul + quantize, down GEMM: each token to every expert's
    rows (x holds G * rows tokens, viewed per expert as [G, rows, H])."""
    G = w13.q.shape[0]
    routing = epkit.route(logits, cfg, bias=bias)
    xq = epkit.quantize(x)
    a = xq.q.view(G, -1, x.shape[1])
    a_s = xq.scale.view(G, -1, x.shape[1] // 128)
    h = epkit.grouped_gemm(a, a_s, w13.q, w13.scale_inv, counts)
    act = epkit.silu_mul_quantize(h, counts)
    y = epkit.grouped_gemm(act.q, act.scale, w2.q, w2.scale_inv, counts)
    return routing, xq, h, act, y


def _pipeline_inputs(case, G=4, rows=16, H=512, I=256):
    g = _gen(case)
    kw = ROUTERS["grouped-small"]
    logits = _logits(g, G * rows, kw["num_experts"], True, torch.float32)
    bias = torch.randn(kw["num_experts"], generator=g, device="cuda") * 0.05
    x = _activations(g, G * rows, H)
    w13 = epkit.quantize_weights((torch.randn(G, 2 * I, H, generator=g, device="cuda") * 0.05).to(torch.bfloat16))
    w2 = epkit.quantize_weights((torch.randn(G, H, I, generator=g, device="cuda") * 0.05).to(torch.bfloat16))
    counts = torch.tensor([rows, 0, 5, rows - 1][:G], dtype=torch.int32, device="cuda")
    return x, logits, bias, counts, w13, w2, epkit.RouterConfig(**kw)


def _assert_pipelines_equal(got, want, counts, tag):
    (gr, gq, gh, ga, gy), (wr, wq, wh, wa, wy) = got, want
    assert torch.equal(gr.topk_idx, wr.topk_idx) and _same_bits(gr.topk_weights, wr.topk_weights), f"{tag}: route"
    assert _same_bytes(gq.q, wq.q) and _same_bits(gq.scale, wq.scale), f"{tag}: quantize"
    for e, c in enumerate(counts.tolist()):  # rows past the counts are not written: compare the rest
        assert torch.equal(gh[e, :c], wh[e, :c]), f"{tag}: up/gate GEMM, expert {e}"
        assert _same_bytes(ga.q[e, :c], wa.q[e, :c]) and _same_bits(ga.scale[e, :c], wa.scale[e, :c]), \
            f"{tag}: silu_mul_quantize, expert {e}"
        assert torch.equal(gy[e, :c], wy[e, :c]), f"{tag}: down GEMM, expert {e}"


def _compile_config():
    from torch import _dynamo
    _dynamo.reset()
    try:
        from torch._inductor import config as inductor_config
        inductor_config.compile_threads = 1  # these graphs hold custom ops and views: no worker pool needed
    except (ImportError, AttributeError):
        pass


@gpu
def test_torch_compile_ops():
    """torch.compile(fullgraph=True) of a function calling every op traces them as custom ops (a
    graph break would fail it) and computes what the eager calls compute; quantize_weights too; and
    with the ops disabled (EPKIT_TORCH_OPS=0) the calls break the graph and still run correctly."""
    _compile_config()
    inputs = _pipeline_inputs(700)
    counts = inputs[3]
    want = _pipeline(*inputs)
    got = torch.compile(_pipeline, fullgraph=True)(*inputs)
    torch.cuda.synchronize()
    _assert_pipelines_equal(got, want, counts, _seed_msg("torch.compile(fullgraph=True)"))
    w = (torch.randn(2, 256, 384, generator=_gen(701), device="cuda") * 0.05).to(torch.bfloat16)
    qw = torch.compile(lambda t: epkit.quantize_weights(t, ue8m0=True), fullgraph=True)(w)
    ew = epkit.quantize_weights(w, ue8m0=True)
    torch.cuda.synchronize()
    assert _same_bytes(qw.q, ew.q) and _same_bits(qw.scale_inv, ew.scale_inv), _seed_msg("compiled quantize_weights")
    default = epkit._ops.use_ops
    try:
        epkit._ops.use_ops = False
        _compile_config()
        broken = torch.compile(_pipeline)(*inputs)
        torch.cuda.synchronize()
        _assert_pipelines_equal(broken, want, counts, _seed_msg("torch.compile with graph breaks"))
    finally:
        epkit._ops.use_ops = default
        _compile_config()
    epkit.check_moe_errors()


XQ_POISON, ONE_BITS = 0x5A, 0x3F800000


@gpu
def test_cuda_graph_ops():
    """The ops captured in one CUDA graph with m and the expert counts on the device, replayed with
    new inputs, m and counts; each replay equals eager calls. A GroupedGemm shape first seen inside
    a capture raises EpkitError naming it."""
    G, rows, H, I = 4, 16, 512, 256
    x, logits, bias, counts, w13, w2, cfg = _pipeline_inputs(800, G, rows, H, I)
    T = G * rows
    m_dev = torch.tensor([T], dtype=torch.int32, device="cuda")
    m_used = torch.zeros(1, dtype=torch.int32, device="cuda")
    routing = epkit.Routing(torch.empty(T, cfg.topk, dtype=torch.int32, device="cuda"),
                            torch.empty(T, cfg.topk, dtype=torch.float32, device="cuda"))
    xq = epkit.Quantized(torch.empty(T, H, dtype=FP8, device="cuda"),
                         torch.empty(T, H // 128, dtype=torch.float32, device="cuda"))
    h = torch.empty(G, rows, 2 * I, dtype=torch.bfloat16, device="cuda")
    act = epkit.Quantized(torch.empty(G, rows, I, dtype=FP8, device="cuda"),
                          torch.empty(G, rows, I // 128, dtype=torch.float32, device="cuda"))
    y = torch.empty(G, rows, H, dtype=torch.bfloat16, device="cuda")
    rec = epkit.ErrorRecord()

    def body():
        epkit.route(logits, cfg, bias=bias, num_tokens=m_dev, num_tokens_out=m_used, out=routing, error=rec)
        epkit.quantize(x, num_tokens=m_used, out=xq, error=rec)
        epkit.grouped_gemm(xq.q.view(G, rows, H), xq.scale.view(G, rows, H // 128), w13.q, w13.scale_inv, counts, out=h,
                           error=rec)
        epkit.silu_mul_quantize(h, counts, out=act, error=rec)
        epkit.grouped_gemm(act.q, act.scale, w2.q, w2.scale_inv, counts, out=y, error=rec)

    body()  # the first call of each GEMM shape builds its GroupedGemm: before capturing
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    g = _gen(801)
    for it, (m, cnt) in enumerate(((T, [rows, 0, 5, rows - 1]), (5, [3, rows, 0, 1]), (0, [0, 0, 0, 0]))):
        x.copy_(_activations(g, T, H))
        logits.copy_(_logits(g, T, cfg.num_experts, it % 2 == 0, torch.float32))
        m_dev.fill_(m)
        counts.copy_(torch.tensor(cnt, dtype=torch.int32, device="cuda"))
        for t in (*routing, h, *act, y):
            _poison(t)
        # xq's rows >= m feed the GEMMs (every expert view reads its first count rows): poison them
        # with finite values (e4m3 0x5a = 20, scale 1.0) so that both sides compute the same bits.
        _poison(xq.q, XQ_POISON), _poison(xq.scale, ONE_BITS)
        graph.replay()
        torch.cuda.synchronize()
        tag = _seed_msg(f"graph replay {it} m={m} counts={cnt}")
        assert int(m_used) == m, tag
        wr = epkit.route(logits, cfg, bias=bias, num_tokens=m)
        wq = epkit.quantize(x, num_tokens=m)
        torch.cuda.synchronize()
        assert torch.equal(routing.topk_idx[:m], wr.topk_idx[:m]), f"{tag}: route"
        assert _same_bits(routing.topk_weights[:m], wr.topk_weights[:m]), f"{tag}: route weights"
        assert _untouched(routing.topk_idx[m:]) and _untouched(xq.q[m:], XQ_POISON), f"{tag}: rows >= m written"
        assert _untouched(xq.scale[m:], ONE_BITS), f"{tag}: scale rows >= m written"
        assert _same_bytes(xq.q[:m], wq.q[:m]) and _same_bits(xq.scale[:m], wq.scale[:m]), f"{tag}: quantize"
        # The GEMMs read xq rows < count of each expert view; rows >= m of xq are poison there, so
        # compare against eager calls on the replay's own inputs.
        eh = epkit.grouped_gemm(xq.q.view(G, rows, H), xq.scale.view(G, rows, H // 128), w13.q, w13.scale_inv, counts)
        ea = epkit.silu_mul_quantize(h, counts)
        ey = epkit.grouped_gemm(act.q, act.scale, w2.q, w2.scale_inv, counts)
        torch.cuda.synchronize()
        for e, c in enumerate(cnt):
            assert torch.equal(h[e, :c], eh[e, :c]), f"{tag}: up/gate GEMM, expert {e}"
            assert _same_bytes(act.q[e, :c], ea.q[e, :c]) and _same_bits(act.scale[e, :c], ea.scale[e, :c]), \
                f"{tag}: silu_mul_quantize, expert {e}"
            assert torch.equal(y[e, :c], ey[e, :c]), f"{tag}: down GEMM, expert {e}"
            assert _untouched(h[e, c:]) and _untouched(y[e, c:]), f"{tag}: rows past count {e} written"
    rec.check()
    del graph
    # A shape never seen before cannot get its GroupedGemm inside a capture.
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(epkit.EpkitError, match=r"n=384, k=512.*inside a CUDA graph capture"):
        with torch.cuda.graph(graph):
            epkit.grouped_gemm(xq.q.view(G, rows, H), xq.scale.view(G, rows, H // 128),
                               torch.zeros(G, 384, H, dtype=torch.uint8, device="cuda").view(FP8),
                               torch.ones(G, 3, H // 128, device="cuda"), counts, expected_m=3)
    epkit.check_moe_errors()


@gpu
def test_moe_layer_of_several_ranks_needs_nvshmem():
    from _moe_cases import errors_before_init
    errors_before_init(SEED)


# -- MoELayer, in spawned ranks ----------------------------------------------------------------

def _run(fn, world_size, *args):
    from _harness import run_ranks
    run_ranks(fn, world_size, *args)


@gpu
def test_moe_layer_world_size_1():
    """Every schedule against the composition, m in {0, 1, odd, M}, the stage calls, a device m above
    the rows reported by check(), and bad arguments."""
    from _moe_cases import layer_w1
    _run(layer_w1, 1, SEED)


@gpu
def test_moe_layer_world_size_1_without_nvshmem():
    """The same cases in a process that never calls nvshmem_init: the one-GPU user's layer."""
    from _harness import run_ranks
    from _moe_cases import layer_w1_without_nvshmem
    run_ranks(layer_w1_without_nvshmem, 1, SEED, init_nvshmem=False)


@gpu
def test_moe_layer_cuda_graph_and_torch_compile():
    from _moe_cases import layer_graph_and_compile
    _run(layer_graph_and_compile, 1, SEED)


@gpu
@pytest.mark.parametrize("world_size,dp_size,schedules", [
    (2, 1, ("none", "microbatch")),
    pytest.param(2, 2, ("none", "dispatch_overlap", "microbatch"), marks=stress),
    pytest.param(4, 2, ("none", "dispatch_overlap", "microbatch"), marks=[stress, pytest.mark.xdist_group("four_pes")]),
    pytest.param(2, 1, ("dispatch_overlap",), marks=stress),
])
def test_moe_layer_multi_rank(world_size, dp_size, schedules):
    from _moe_cases import layer_forward_cases
    _run(layer_forward_cases, world_size, dp_size, SEED, schedules)
