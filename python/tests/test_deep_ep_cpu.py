"""epkit.deep_ep without a GPU: DeepEP's size-hint formulas and Config, every argument check, the
torch-only layout conversions, the API's signatures against DeepEP V1's, and the whole mapping run
on a host model of epkit.AllToAll's contract (_deep_ep_host_model.py) with the same test bodies the
GPU suite runs (_deep_ep_cases.py).

These need torch, not the compiled extension: python/epkit/_deep_ep_spec.py and deep_ep.py are
loaded from the source tree (no GPU, no build). Inputs are fresh each run: EPKIT_PY_SEED (default:
random) seeds them and failures name it.
"""

import inspect
import math
import os
import random
import sys

import pytest

torch = pytest.importorskip("torch", reason="epkit's Python tests need torch (the deep_ep CPU tests too)")

import _deep_ep_cases as C  # noqa: E402
import _deep_ep_host_model as hm  # noqa: E402

SEED = int(os.environ.get("EPKIT_PY_SEED") or random.SystemRandom().randrange(1 << 30))
dep = hm.load()
S = sys.modules[hm.PACKAGE + "._deep_ep_spec"]
Err = S.EpkitError


def _raises(fn, *needles, exc=None):
    with pytest.raises(exc or Err) as info:
        fn()
    for n in needles:
        assert n in str(info.value), f"{str(info.value)!r} does not name {n!r}"


# =================================================================================================
# Size hints and Config (numbers worked out by hand from DeepEP V1's csrc/config.hpp)
# =================================================================================================

def test_low_latency_rdma_size_hint_deepseek_v3_ep8():
    # 128 tokens, H 7168, E 256: 56 scales; dispatch message 16 + max(14336, 7168 + 224) = 14352 B;
    # combine message 56 * 4 + 14336 = 14560 B; send = max(128 * 14352, 256 * 128 * 14560) =
    # 477,102,080; receive = max(256 * 128 * 14352, 477,102,080) = 477,102,080; signalling
    # align(256 * 4, 128) = 1024; total 2 * (477,102,080 * 2 + 1024) = 1,908,410,368, an exact
    # multiple of 128, to which the rounding adds 128.
    assert dep.Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 256) == 1_908_410_496
    # The receive buffer is per expert, not per rank: the same at EP2 (SYSTEM.md: 1.9 GB at EP2).
    assert dep.Buffer.get_low_latency_rdma_size_hint(128, 7168, 2, 256) == 1_908_410_496
    # H 4096, E 64: messages 8208 / 8320 B; send = receive = 64 * 128 * 8320 = 68,157,440;
    # signalling 256; 2 * (2 * 68,157,440 + 256) = 272,630,272 (= 128 * 2,129,924) + 128.
    assert dep.Buffer.get_low_latency_rdma_size_hint(128, 4096, 8, 64) == 272_630_400


def test_config_defaults_checks_and_rounding():
    c = dep.Config()
    assert (c.num_sms, c.num_max_nvl_chunked_send_tokens, c.num_max_nvl_chunked_recv_tokens,
            c.num_max_rdma_chunked_send_tokens, c.num_max_rdma_chunked_recv_tokens) == (20, 6, 256, 6, 258)
    # DeepEP rounds the RDMA receive chunk up to a multiple of the send chunk (256 -> 258 above, 128 -> 132).
    assert dep.Config(20, 24, 256, 6, 128).num_max_rdma_chunked_recv_tokens == 132
    assert dep.Config(num_sms=24, num_max_nvl_chunked_send_tokens=8).num_max_nvl_chunked_send_tokens == 8
    _raises(lambda: dep.Config(20, 256, 256), "num_max_nvl_chunked_send_tokens = 256", "below")
    _raises(lambda: dep.Config(-2), "num_sms = -2")
    # RDMA receive 100 rounds up to the send chunk 128, which is not below it.
    _raises(lambda: dep.Config(20, 6, 256, 128, 100), "num_max_rdma_chunked_send_tokens = 128", "below")
    _raises(lambda: dep.Config(20.0), "num_sms")


def test_config_buffer_size_hints():
    c8 = dep.Config(20, 6, 256, 6, 128)
    # 10 channels x 8 NVL ranks = 80 queues of 256 tokens: 80 * 5 * 4 (heads, tails, offsets) +
    # 20480 * (14336 + 8 + 128 * 8 + 128 * 4 + 128 * 4) = 335,709,760, aligned to 128.
    assert c8.get_nvl_buffer_size_hint(7168 * 2, 8) == 335_709_824
    assert c8.get_rdma_buffer_size_hint(7168 * 2, 8) == 0  # one NVLink domain: no RDMA buffer
    c16 = dep.Config(20, 36, 288, 20, 128)  # DeepEP's EP16 dispatch config; RDMA receive 128 -> 140
    # NVL: 80 queues of 288: 80 * 7 * 4 + 23040 * (14336 + 8 + 1024 + 512 + 512) = 377,673,920 -> 377,673,984.
    assert c16.get_nvl_buffer_size_hint(7168 * 2, 16) == 377_673_984
    # RDMA: 10 channels x 2 RDMA ranks = 20 queues of 140, doubled: 20 * 18 * 8 + 2800 * 2 *
    # (14336 + 8 + 1024 + 512 + 512 + 16) = 91,887,680 -> 91,887,744.
    assert c16.get_rdma_buffer_size_hint(7168 * 2, 16) == 91_887_744
    _raises(lambda: c16.get_nvl_buffer_size_hint(7168 * 2, 12), "num_ranks = 12")


def test_recommended_configs_follow_num_sms():
    saved = dep.Buffer.num_sms
    try:
        assert saved == 20
        c = dep.Buffer.get_dispatch_config(8)
        assert (c.num_sms, c.num_max_nvl_chunked_send_tokens, c.num_max_nvl_chunked_recv_tokens) == (20, 6, 256)
        assert dep.Buffer.get_combine_config(2).num_max_nvl_chunked_send_tokens == 10
        dep.Buffer.set_num_sms(24)
        assert dep.Buffer.get_dispatch_config(16).num_sms == 24
        assert dep.Buffer.get_combine_config(160).num_max_nvl_chunked_recv_tokens == 720
        _raises(lambda: dep.Buffer.set_num_sms(23), "even", "23")
        _raises(lambda: dep.Buffer.get_dispatch_config(3), "unsupported number of EP ranks 3")
    finally:
        dep.Buffer.num_sms = saved


# =================================================================================================
# Argument checks (tensor metadata only: CPU tensors stand for device ones)
# =================================================================================================

def _ll_args(m=5, H=256, K=4, E=16, M=24, **kw):
    a = dict(x=torch.zeros(m, H, dtype=torch.bfloat16), topk_idx=torch.zeros(m, K, dtype=torch.int64),
             num_max_dispatch_tokens_per_rank=M, num_experts=E, num_ranks=4)
    a.update(kw)
    return a


def test_low_latency_dispatch_checks():
    chk = S.check_low_latency_dispatch
    assert chk(**_ll_args()) == (5, 256, 4)
    assert chk(**_ll_args(m=0)) == (0, 256, 4)
    _raises(lambda: chk(**_ll_args(x=torch.zeros(5, 256))), "x has dtype torch.float32", "bfloat16")
    _raises(lambda: chk(**_ll_args(x=torch.zeros(5, 256, dtype=torch.bfloat16).t())), "x", "contiguous")
    _raises(lambda: chk(**_ll_args(H=200)), "hidden = 200", "multiple of 128")
    _raises(lambda: chk(**_ll_args(m=25)), "25 tokens", "num_max_dispatch_tokens_per_rank = 24")
    _raises(lambda: chk(**_ll_args(K=17)), "top-k = 17", "1 to 16")
    _raises(lambda: chk(**_ll_args(K=4, E=4, num_ranks=4, topk_idx=torch.zeros(5, 5, dtype=torch.int64))),
            "top-k = 5", "num_experts = 4")
    _raises(lambda: chk(**_ll_args(topk_idx=torch.zeros(5, 4, dtype=torch.int32))), "topk_idx", "torch.int32", "int64")
    _raises(lambda: chk(**_ll_args(topk_idx=torch.zeros(6, 4, dtype=torch.int64))), "6 rows", "x has 5")
    _raises(lambda: chk(**_ll_args(E=18)), "num_experts = 18", "multiple of the number of ranks = 4")
    _raises(lambda: chk(**_ll_args(E=8192)), "num_experts = 8192", "[1, 4096]")
    _raises(lambda: chk(**_ll_args(M=0)), "num_max_dispatch_tokens_per_rank = 0")
    _raises(lambda: chk(**_ll_args(use_ue8m0=True)), "round_scale")
    _raises(lambda: chk(**_ll_args(use_fp8=False, round_scale=True, use_ue8m0=True)), "use_fp8")
    _raises(lambda: chk(**_ll_args(async_finish=True, return_recv_hook=True)), "async_finish", "return_recv_hook")
    _raises(lambda: chk(**_ll_args(cumulative_local_expert_recv_stats=torch.zeros(4, dtype=torch.int64))),
            "cumulative_local_expert_recv_stats", "int64")
    _raises(lambda: chk(**_ll_args(cumulative_local_expert_recv_stats=torch.zeros(5, dtype=torch.int32))),
            "5 entries", "local expert = 4")
    _raises(lambda: chk(**_ll_args(dispatch_wait_recv_cost_stats=torch.zeros(4, dtype=torch.int64))),
            "dispatch_wait_recv_cost_stats")
    S.check_expert_range(15, 16)
    _raises(lambda: S.check_expert_range(16, 16), "expert index 16", "num_experts = 16")


def test_low_latency_combine_checks():
    def args(**kw):
        a = dict(x=torch.zeros(4, 4 * 24, 256, dtype=torch.bfloat16), topk_idx=torch.zeros(5, 4, dtype=torch.int64),
                 topk_weights=torch.zeros(5, 4), num_local_experts=4, num_ranks=4, num_max=24, hidden=256,
                 dispatch_tokens=5, dispatch_topk=4)
        a.update(kw)
        return a
    chk = S.check_low_latency_combine
    assert chk(**args()) == 5
    _raises(lambda: chk(**args(x=torch.zeros(4, 95, 256, dtype=torch.bfloat16))), "x has shape (4, 95, 256)", "[4, 96, 256]")
    _raises(lambda: chk(**args(topk_weights=torch.zeros(5, 4, dtype=torch.bfloat16))), "topk_weights", "bfloat16")
    _raises(lambda: chk(**args(topk_idx=torch.zeros(6, 4, dtype=torch.int64), topk_weights=torch.zeros(6, 4))),
            "[5, 4]", "dispatch's topk_idx")
    _raises(lambda: chk(**args(out=torch.zeros(5, 128, dtype=torch.bfloat16))), "out has shape (5, 128)", "[5, 256]")
    _raises(lambda: chk(**args(use_logfmt=True)), "use_logfmt")
    _raises(lambda: chk(**args(combine_wait_recv_cost_stats=torch.zeros(4, dtype=torch.int64))),
            "combine_wait_recv_cost_stats")
    S.check_sbo_arguments({"overlap": False, "num_sms": 3})
    _raises(lambda: S.check_sbo_arguments({"overlap": True}), "overlap=True")
    _raises(lambda: S.check_sbo_arguments({"bogus": 1}), "bogus", exc=TypeError)


def test_normal_checks():
    m, H, W, E, K = 6, 256, 4, 16, 4

    def args(**kw):
        a = dict(x=torch.zeros(m, H, dtype=torch.bfloat16), x_scales=None, handle_given=False,
                 num_tokens_per_rank=torch.zeros(W, dtype=torch.int32),
                 is_token_in_rank=torch.zeros(m, W, dtype=torch.bool),
                 num_tokens_per_expert=torch.zeros(E, dtype=torch.int32),
                 topk_idx=torch.zeros(m, K, dtype=torch.int64), topk_weights=torch.zeros(m, K),
                 expert_alignment=1, num_worst_tokens=0, num_ranks=W)
        a.update(kw)
        return a
    chk = S.check_normal_dispatch
    assert chk(**args()) == (m, H, E, K)
    assert chk(**args(x=torch.zeros(m, H, dtype=torch.float8_e4m3fn), x_scales=torch.zeros(H // 128, m).t())) == (m, H, E, K)
    assert chk(**args(x=torch.zeros(m, H, dtype=torch.float8_e4m3fn),
                      x_scales=torch.zeros(m, 1, dtype=torch.int32))) == (m, H, E, K)
    assert chk(**args(handle_given=True, topk_idx=None, topk_weights=None)) == (m, H, 0, 0)
    _raises(lambda: chk(**args(x=torch.zeros(m, H, dtype=torch.float16))), "x has dtype torch.float16", "bfloat16")
    _raises(lambda: chk(**args(x=torch.zeros(m, 200, dtype=torch.bfloat16))), "hidden = 200", "multiple of 16")
    _raises(lambda: chk(**args(x=torch.zeros(m, H, dtype=torch.float8_e4m3fn), x_scales=torch.zeros(m, 4))),
            "4 columns", "1 to 3")
    _raises(lambda: chk(**args(x=torch.zeros(m, H, dtype=torch.float8_e4m3fn), x_scales=torch.zeros(m, 2).half())),
            "scales", "float16")
    _raises(lambda: chk(**args(handle_given=True)), "cached dispatch", "topk_idx")
    _raises(lambda: chk(**args(is_token_in_rank=None, num_tokens_per_expert=None)),
            "is_token_in_rank", "num_tokens_per_expert")
    _raises(lambda: chk(**args(is_token_in_rank=torch.zeros(m, W + 1, dtype=torch.bool))), f"expected [{m}, {W}]")
    _raises(lambda: chk(**args(num_tokens_per_expert=torch.zeros(E + 1, dtype=torch.int32))),
            f"num_experts) = {E + 1}", f"multiple of the number of ranks = {W}")
    _raises(lambda: chk(**args(topk_weights=None)), "topk_idx and topk_weights go together")
    _raises(lambda: chk(**args(topk_idx=torch.zeros(m, 17, dtype=torch.int64), topk_weights=torch.zeros(m, 17))),
            "top-k = 17")
    _raises(lambda: chk(**args(topk_idx=None, topk_weights=None, num_worst_tokens=8)), "num_worst_tokens > 0")
    _raises(lambda: chk(**args(expert_alignment=0)), "expert_alignment = 0")
    _raises(lambda: chk(**args(num_worst_tokens=-1)), "num_worst_tokens = -1")
    c = S.check_normal_combine
    assert c(torch.zeros(9, H, dtype=torch.bfloat16), 9, H, None, None) == 0
    assert c(torch.zeros(9, H, dtype=torch.bfloat16), 9, H, torch.zeros(9, 3), None) == 3
    _raises(lambda: c(torch.zeros(8, H, dtype=torch.bfloat16), 9, H, None, None), "x has shape (8, 256)", "[9, 256]")
    _raises(lambda: c(torch.zeros(9, H, dtype=torch.bfloat16), 9, H, None, torch.zeros(9, H)), "bias")
    _raises(lambda: c(torch.zeros(9, H, dtype=torch.bfloat16), 9, H, torch.zeros(9, 3).double(), None),
            "topk_weights", "float64")
    _raises(lambda: S.check_stream_flags(None, True, True), "allocate_on_comm_stream")
    S.check_stream_flags(object(), True, True)
    _raises(lambda: S.check_dispatch_layout(torch.zeros(3, 2, dtype=torch.int32), 8, 4), "topk_idx", "int32")


# =================================================================================================
# Layout conversions
# =================================================================================================

def test_split_fp32_is_exact():
    g = torch.Generator().manual_seed(SEED)
    w = torch.cat([torch.randn(4096, generator=g), torch.rand(4096, generator=g),
                   torch.randn(4096, generator=g) * torch.exp2(torch.randint(-100, 100, (4096,), generator=g).float()),
                   torch.tensor([0.0, -0.0, 1.0, -1.0, 3.0e38, -3.0e38, 1.0e-30, 2.0 ** -100])])
    pieces = S.split_fp32(w)
    assert pieces.dtype == torch.bfloat16 and pieces.shape == (w.numel(), 3)
    back = S.join_fp32(pieces)
    assert torch.equal(back.view(torch.int32), w.view(torch.int32)), f"split_fp32 is lossy (EPKIT_PY_SEED={SEED})"
    special = torch.tensor([float("inf"), -float("inf"), float("nan")])
    back = S.join_fp32(S.split_fp32(special))
    assert back[0] == float("inf") and back[1] == -float("inf") and torch.isnan(back[2])


def test_deepep_scale_layouts():
    L, N, Sc = 3, 8, 5
    g = torch.Generator().manual_seed(SEED + 1)
    rows = torch.rand(L, N, Sc, generator=g) + 0.01
    out = S.empty_deepep_scales(L, N, Sc, False, "cpu")
    # dispatch (expert_scales_mn_major) writes the [L, Sc, N] storage; the view reads it back as rows
    out.transpose(1, 2).copy_(rows.transpose(1, 2).contiguous())
    assert out.shape == (L, N, Sc) and out.stride() == (Sc * N, 1, N) and torch.equal(out, rows)
    assert out.transpose(1, 2).is_contiguous()
    pow2 = torch.exp2(torch.randint(-20, 10, (L, N, Sc), generator=g).float())
    packed = S.pack_ue8m0_scales(S.empty_deepep_scales(L, N, Sc, True, "cpu"), pow2)
    P = (Sc + 3) // 4
    assert packed.dtype == torch.int32 and packed.shape == (L, N, P) and packed.stride() == (P * N, 1, N)
    for el in range(L):
        for n in range(N):
            for s in range(Sc):
                word = int(packed[el, n, s // 4]) & 0xFFFFFFFF
                byte = (word >> (8 * (s % 4))) & 0xFF
                assert byte == math.frexp(float(pow2[el, n, s]))[1] - 1 + 127
            assert (int(packed[el, n, 1]) >> 8) == 0  # the pad bytes of the last word are zero
    assert torch.equal(S.unpack_ue8m0(packed, Sc), pow2)


def test_dispatch_layout_against_loops():
    g = torch.Generator().manual_seed(SEED + 2)
    for W, E, m, K in ((4, 16, 37, 4), (16, 64, 20, 6), (2, 8, 1, 8)):
        idx, _ = C.routing(g, m, E, K, masked=0.3)
        idx[m // 2, :2] = idx[m // 2, 0]  # an expert listed twice counts twice, its rank once
        per_rank, per_rdma, per_expert, in_rank = S.dispatch_layout(idx, E, W)
        ref_rank, ref_expert, ref_in = C._layout_reference(idx, E, W)
        assert torch.equal(per_rank, ref_rank) and torch.equal(per_expert, ref_expert) and torch.equal(in_rank, ref_in)
        if W > 8:
            want = torch.tensor([int(ref_in[:, n * 8:(n + 1) * 8].any(1).sum()) for n in range(W // 8)], dtype=torch.int32)
            assert torch.equal(per_rdma, want)
        else:
            assert per_rdma is None


def test_routing_from_rank_mask():
    g = torch.Generator().manual_seed(SEED + 3)
    for W in (1, 4, 16, 32):
        mask = torch.rand(40, W, generator=g) < 0.3
        if W > 16:
            mask[:, 16:] &= False
            mask[3, :] = False
            mask[3, [2, 20, 31]] = True
        r = S.routing_from_rank_mask(mask)
        assert r.dtype == torch.int32 and r.shape == (40, min(W, 16))
        for t in range(40):
            want = [i for i in range(W) if mask[t, i]]
            got = [int(v) for v in r[t] if v >= 0]
            assert sorted(got) == want and (r[t] >= 0).sum() == len(want)
            if W > 16:
                assert got == want and all(int(v) == -1 for v in r[t, len(want):])


def test_meta_roundtrip():
    g = torch.Generator().manual_seed(SEED + 4)
    tmpl = S.meta_template(64, 3, "cpu")
    for K in (1, 4, 7, 16):
        m = 9
        idx, w = C.routing(g, m, 512, K, masked=0.3)
        meta = S.pack_meta(tmpl, m, idx, w)
        assert meta.shape == (m, S.META_WORDS) and meta.dtype == torch.int32
        for dt in (torch.bfloat16, torch.float8_e4m3fn):
            x = torch.randn(m, 256, generator=g).to(dt)
            wide = S.append_meta(x, meta)
            assert wide.shape == (m, S.normal_hidden(256, dt)) and torch.equal(wide[:, :256].view(torch.uint8), x.view(torch.uint8))
            rows = wide[:, 256:].view(torch.int32)
            token, src, ridx, rw = S.unpack_meta(rows, K)
            assert token.tolist() == list(range(m)) and (src == 3).all()
            assert torch.equal(ridx, idx) and torch.equal(rw.view(torch.int32), w.view(torch.int32))
    assert torch.equal(S.pack_meta(tmpl, 5, None, None), tmpl[:5])
    scales = torch.rand(7, 2)
    wide = S.widen_scales(scales.t().contiguous().t(), S.normal_scale_columns(256))
    assert wide.shape == (7, 3) and torch.equal(wide[:, :2], scales) and (wide[:, 2] == 0).all()
    packed = torch.randint(0, 1 << 30, (7, 1), dtype=torch.int32)
    assert torch.equal(S.widen_scales(packed, 3)[:, :1].view(torch.int32), packed)


def test_remap_counts_and_bounds():
    idx = torch.tensor([[0, 5, -1, 6], [7, 4, 4, 1], [2, 3, 8, 9]])
    w = torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    valid = torch.tensor([True, True, False])
    r, rw, _ = S.remap_topk(idx, w, valid, rank=1, num_local_experts=4)
    assert r.tolist() == [[-1, 1, -1, 2], [3, 0, 0, -1], [-1, -1, -1, -1]]
    assert rw.tolist() == [[0, 2, 0, 4], [5, 6, 7, 0], [0, 0, 0, 0]]
    assert S.local_expert_counts(r, 4).tolist() == [2, 1, 1, 1]
    assert S.align_counts([0, 1, 5, 128], 128) == [0, 128, 128, 128]
    assert S.normal_max_tokens(0, 1) == 128 and S.normal_max_tokens(0, 129) == 256
    assert S.normal_max_tokens(1024, 5) == 1024  # never shrinks
    _raises(lambda: S.normal_max_tokens(0, 70000), "70000")
    src = torch.arange(12).view(6, 2)
    got = S.gather_rows(src, torch.tensor([4, 1]), 4, fill=-1)
    assert got.tolist() == [[8, 9], [2, 3], [-1, -1], [-1, -1]]


# =================================================================================================
# The API's shape against DeepEP V1 (deep_ep/buffer.py at 567632d)
# =================================================================================================

DEEPEP_V1_SIGNATURES = {
    "__init__": ["self", "group", "num_nvl_bytes", "num_rdma_bytes", "low_latency_mode", "num_qps_per_rank",
                 "allow_nvlink_for_low_latency_mode", "allow_mnnvl", "use_fabric", "explicitly_destroy",
                 "enable_shrink", "comm"],
    "get_dispatch_layout": ["self", "topk_idx", "num_experts", "previous_event", "async_finish",
                            "allocate_on_comm_stream"],
    "dispatch": ["self", "x", "handle", "num_tokens_per_rank", "num_tokens_per_rdma_rank", "is_token_in_rank",
                 "num_tokens_per_expert", "topk_idx", "topk_weights", "expert_alignment", "num_worst_tokens", "config",
                 "previous_event", "async_finish", "allocate_on_comm_stream"],
    "combine": ["self", "x", "handle", "topk_weights", "bias", "config", "previous_event", "async_finish",
                "allocate_on_comm_stream"],
    "low_latency_dispatch": ["self", "x", "topk_idx", "num_max_dispatch_tokens_per_rank", "num_experts",
                             "cumulative_local_expert_recv_stats", "dispatch_wait_recv_cost_stats", "use_fp8",
                             "round_scale", "use_ue8m0", "async_finish", "return_recv_hook"],
    "low_latency_combine": ["self", "x", "topk_idx", "topk_weights", "handle", "use_logfmt", "zero_copy",
                            "async_finish", "return_recv_hook", "out", "combine_wait_recv_cost_stats"],
    "clean_low_latency_buffer": ["self", "num_max_dispatch_tokens_per_rank", "hidden", "num_experts"],
    "get_next_low_latency_combine_buffer": ["self", "handle"],
    "get_low_latency_rdma_size_hint": ["num_max_dispatch_tokens_per_rank", "hidden", "num_ranks", "num_experts"],
    "get_dispatch_config": ["num_ranks"],
    "get_combine_config": ["num_ranks"],
    "set_num_sms": ["new_num_sms"],
    "capture": [],
    "get_comm_stream": ["self"],
    "destroy": ["self"],
    "is_sm90_compiled": [],
}
DEEPEP_V1_DEFAULTS = {
    "__init__": dict(num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, num_qps_per_rank=24,
                     allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False, use_fabric=False,
                     explicitly_destroy=False, enable_shrink=False, comm=None),
    "dispatch": dict(handle=None, expert_alignment=1, num_worst_tokens=0, config=None, previous_event=None,
                     async_finish=False, allocate_on_comm_stream=False),
    "combine": dict(topk_weights=None, bias=None, config=None, previous_event=None, async_finish=False,
                    allocate_on_comm_stream=False),
    "low_latency_dispatch": dict(cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                                 use_fp8=True, round_scale=False, use_ue8m0=False, async_finish=False,
                                 return_recv_hook=False),
    "low_latency_combine": dict(use_logfmt=False, zero_copy=False, async_finish=False, return_recv_hook=False,
                                out=None, combine_wait_recv_cost_stats=None),
}


def test_api_matches_deepep_v1():
    for name, params in DEEPEP_V1_SIGNATURES.items():
        sig = inspect.signature(getattr(dep.Buffer, name))
        positional = [p.name for p in sig.parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        assert positional == params, f"Buffer.{name}: {positional} != DeepEP's {params}"
        for arg, default in DEEPEP_V1_DEFAULTS.get(name, {}).items():
            assert sig.parameters[arg].default == default, f"Buffer.{name}({arg}=...) default"
    assert dep.Buffer.num_sms == 20 and dep.topk_idx_t is torch.int64
    for name in ("Buffer", "Config", "EventOverlap", "topk_idx_t"):
        assert hasattr(dep, name)
    ev = dep.EventOverlap()
    assert ev.event is None and ev.extra_tensors is None
    with ev:
        pass


# =================================================================================================
# The mapping end to end on the host model (ranks as threads)
# =================================================================================================

def _host(body, W, **kw):
    def run(rank, world_size, seed):
        getattr(C, body)(C.HostEnv(), rank, world_size, seed, **kw)
    hm.run_threads(W, run, SEED, seed=SEED)


@pytest.mark.parametrize("W", [1, 2, 4, 8])
def test_host_model_low_latency(W):
    _host("low_latency_cases", W)
    _host("low_latency_overlap_cases", W)


def test_host_model_low_latency_partial_ue8m0_word():
    _host("low_latency_cases", 2, hidden=640, variants=[(True, True, True, "hook"), (True, False, False, "async")])


@pytest.mark.parametrize("W,pinned", [(1, True), (2, True), (2, False), (4, True), (8, False)])
def test_host_model_normal(W, pinned):
    _host("normal_cases", W, pinned=pinned)


@pytest.mark.parametrize("W", [2, 4])
def test_host_model_errors(W):
    _host("error_cases", W)


def test_host_model_sglang_low_latency():
    """The SGLang-style body, with the grouped GEMM and SiLU-mul by their torch references."""
    _host("sglang_low_latency_cases", 2)


def test_host_model_capture_guard():
    """A configuration first seen inside a CUDA graph capture cannot create its AllToAll: EpkitError."""
    def run(rank, W, seed):
        env = C.HostEnv()
        buf = env.buffer(low_latency_mode=True)
        x = torch.zeros(3, 256, dtype=torch.bfloat16)
        idx = torch.zeros(3, 2, dtype=torch.int64)
        hm.set_capturing(True)
        try:
            _raises(lambda: buf.low_latency_dispatch(x, idx, 8, 4 * W), "CUDA graph capture", "before capturing")
        finally:
            hm.set_capturing(False)
    hm.run_threads(2, run, SEED, seed=SEED)
