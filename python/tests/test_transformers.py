"""epkit.transformers: epkit as a Hugging Face transformers experts implementation ("epkit") and
MoE blocks patched into epkit.MoELayer (patch_moe), for DeepseekV3MoE, Qwen3MoeSparseMoeBlock and
MixtralSparseMoeBlock built from transformers' own classes.

CPU (no GPU, no compiled extension needed): registration in transformers' experts interfaces, the
ImportError without transformers, the mapping of each transformers config onto MoELayerConfig
(field values, and the routing semantics: the mapped epkit router reproduces transformers' router),
the errors for what epkit does not compute, and the experts implementation's own logic (packed
permutation on the device, "no expert" sentinels, the weight cache and its invalidation, FP8
checkpoints taken as they are, torch.compile(fullgraph=True)) with a torch stand-in for epkit's four
kernels (_hf_cases.RefBackend, float64 references that poison every row they do not own).

GPU (marked gpu; need the compiled extension): the same blocks at the models' real hidden and
intermediate sizes (DeepSeek-V3's 256 experts reduced to 32; stress: all 256), exactly-FP8 weights
(_hf_cases' docstring), 1, odd and ~1000 tokens.

Tolerances. epkit differs from the transformers block (same weights) by its FP8 activations: x and
silu(gate) * up are rounded to e4m3 in 1x128 blocks (3 mantissa bits: relative error up to 2^-4 per
element). That effect is measured in each case, not assumed: `emulate_experts` computes epkit's
documented arithmetic in float64 (bit-exact activation quantizers of _moe_reference) and its relative
Frobenius distance to the block, eps_fp8 (about 4.3%; sanity: above 0.2% since the roundings are
there, below 2 x 2^-4 since two roundings of at most 2^-4 each cannot do more). epkit must then be
within eps_fp8 + 1e-2 of the block (Frobenius; per row within that row's eps_fp8 + 3e-2) and within
1e-2 / 3e-2 per row of the emulation itself (the layer tests' allowance for accumulation order: one
bf16 step that moves one e4m3 code). A wrong expert, a lost token or a wrong weight moves a row by
O(10%) to O(100%).
"""

import importlib
import sys

import pytest

torch = pytest.importorskip("torch", reason="epkit's Python tests need torch")
pytest.importorskip("transformers", reason="epkit.transformers' tests need Hugging Face transformers: "
                                           "pip install 'epkit[transformers]'")

import _hf_cases as C  # noqa: E402
import _moe_reference as R  # noqa: E402

et, HAVE_EXT = C.import_epkit_transformers()

gpu = pytest.mark.gpu
stress = pytest.mark.stress
needs_ext = pytest.mark.skipif(not HAVE_EXT, reason="the GPU tests need epkit's compiled extension (import epkit "
                               f"failed: {getattr(et, '_loaded_without_extension', '')})")
SEED = C.env_seed()
FP8 = torch.float8_e4m3fn
TIGHT_FROB, TIGHT_ROW = 1e-2, 3e-2


def _tag(s):
    return f"{s} (EPKIT_PY_SEED={SEED})"


@pytest.fixture
def ref_backend():
    b = C.RefBackend()
    old = et._use_backend(b)
    yield b
    et._use_backend(old)


# -- registration ------------------------------------------------------------------------------

def test_registration():
    from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS, FP8ExpertsInterface
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface
    assert et.registered()
    assert ALL_EXPERTS_FUNCTIONS.get_interface("epkit", None) is et.experts_forward
    assert ALL_FP8_EXPERTS_FUNCTIONS.get_interface("epkit", None) is et.experts_forward
    before = (dict(ExpertsInterface._global_mapping), dict(FP8ExpertsInterface._global_mapping))
    et.register()
    et.register()
    assert (dict(ExpertsInterface._global_mapping), dict(FP8ExpertsInterface._global_mapping)) == before
    # register() restores the mapping if someone replaced it.
    ExpertsInterface.register("epkit", lambda *a: None)
    assert not et.registered()
    et.register()
    assert et.registered() and ALL_EXPERTS_FUNCTIONS["epkit"] is et.experts_forward
    # transformers' model-level check accepts the name (what from_pretrained(experts_implementation=) runs)...
    model = _tiny_deepseek_model()
    assert model.get_correct_experts_implementation("epkit") == "epkit"
    with pytest.raises(ValueError, match="not supported"):  # ...and is a real check
        model.get_correct_experts_implementation("epkit_not_registered")


def _tiny_deepseek_model(**over):
    import transformers as tf
    kw = dict(vocab_size=64, hidden_size=256, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=2,
              first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=64, q_lora_rank=None,
              qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
              n_group=2, topk_group=1, n_shared_experts=1, num_mtp_layers=0)
    kw.update(over)
    torch.manual_seed(SEED)
    return tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(**kw)).eval()


def test_model_dispatches_to_epkit(ref_backend):
    """set_experts_implementation("epkit") sends every MoE layer's experts through experts_forward."""
    model = _tiny_deepseek_model()
    ids = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        model.set_experts_implementation("eager")
        want = model(ids).logits
        assert ref_backend.calls == []
        model.set_experts_implementation("epkit")
        got = model(ids).logits
    assert model.config._experts_implementation == "epkit"
    # One MoE layer (the first is dense): weights quantized once, then quantize, 2 GEMMs, SiLU-mul.
    assert ref_backend.calls.count("quantize_weights") == 2 and ref_backend.calls.count("grouped_gemm") == 2
    assert torch.isfinite(got).all()
    # FP8 weights and activations against bf16: a few percent on random weights, not O(1).
    assert C.rel_frob(got, want) < 0.1, _tag(f"logits differ by {C.rel_frob(got, want):.3g}")


def test_import_error_without_transformers(monkeypatch):
    """Without transformers, importing epkit.transformers raises ImportError saying what to install."""
    name = et.__name__
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now raises ImportError
    monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r"pip install 'epkit\[transformers\]'"):
        importlib.import_module(name)


# -- the config mapping ------------------------------------------------------------------------

EXPECTED = {
    "deepseek_v3": dict(hidden=7168, intermediate=2048, num_experts=256, topk=8, router_mode="grouped_topk",
                        num_groups=8, topk_groups=4, renormalize=True, routed_scaling=2.5, num_shared_experts=1,
                        shared_intermediate=2048),
    "qwen3_moe": dict(hidden=2048, intermediate=768, num_experts=128, topk=8, router_mode="softmax_topk",
                      num_groups=1, topk_groups=1, renormalize=True, routed_scaling=1.0, num_shared_experts=0),
    "mixtral": dict(hidden=4096, intermediate=14336, num_experts=8, topk=2, router_mode="softmax_topk",
                    num_groups=1, topk_groups=1, renormalize=True, routed_scaling=1.0, num_shared_experts=0),
}


@pytest.mark.parametrize("family", C.FAMILIES)
def test_layer_config_from(family):
    d = et.layer_config_from(C.hf_config(family), max_tokens=512)
    assert set(d) <= C.moe_layer_config_fields(), set(d) - C.moe_layer_config_fields()
    for k, v in EXPECTED[family].items():
        assert d[k] == v, f"{family}: {k} = {d[k]!r}, expected {v!r}"
    assert (d["world_size"], d["rank"], d["dp_size"], d["max_tokens_per_rank"]) == (1, 0, 1, 512)
    assert et.layer_config_from(C.hf_config(family), schedule="microbatch")["schedule"] == "microbatch"
    if HAVE_EXT:
        import epkit
        epkit.MoELayerConfig(**d).validate()


def test_layer_config_from_variants():
    # Qwen3-MoE's own default does not renormalise; several DeepSeek shared experts are one wider.
    assert et.layer_config_from(C.hf_config("qwen3_moe", norm_topk_prob=False))["renormalize"] is False
    d = et.layer_config_from(C.hf_config("deepseek_v3", n_shared_experts=2))
    assert (d["num_shared_experts"], d["shared_intermediate"]) == (1, 4096)
    d = et.layer_config_from(C.hf_config("deepseek_v3", n_shared_experts=0))
    assert (d["num_shared_experts"], d["shared_intermediate"]) == (0, 0)


@pytest.mark.parametrize("family,over,needle", [
    ("deepseek_v3", dict(norm_topk_prob=False), "norm_topk_prob=False"),
    ("deepseek_v3", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ("deepseek_v3", dict(moe_intermediate_size=2000), "moe_intermediate_size=2000 is not a multiple of 128"),
    ("deepseek_v3", dict(n_routed_experts=640, n_group=8), "640 routed experts"),
    ("deepseek_v3", dict(n_routed_experts=32, num_experts_per_tok=12, topk_group=2), "exceeds the experts of the kept"),
    ("qwen3_moe", dict(num_experts_per_tok=17), "num_experts_per_tok=17"),
    ("qwen3_moe", dict(hidden_size=2000, num_attention_heads=16), "hidden_size=2000"),
    ("qwen3_moe", dict(output_router_logits=True), "output_router_logits"),
    ("mixtral", dict(intermediate_size=14000), "intermediate_size=14000"),
])
def test_layer_config_rejects(family, over, needle):
    with pytest.raises(et.UnsupportedError, match=needle) as e:
        et.layer_config_from(C.hf_config(family, **over))
    assert C.hf_config(family).__class__.__name__ in str(e.value)


def test_layer_config_rejects_other_models():
    import transformers as tf
    with pytest.raises(et.UnsupportedError, match="qwen2_moe"):
        et.layer_config_from(tf.Qwen2MoeConfig())


@pytest.mark.parametrize("family,over", [
    ("deepseek_v3", {}), ("qwen3_moe", {}), ("qwen3_moe", dict(norm_topk_prob=False)), ("mixtral", {}),
])
def test_layer_config_reproduces_the_router(family, over):
    """The mapped RouterConfig, run by epkit's router reference (_moe_reference.route: the kernels'
    arithmetic), chooses transformers' experts with transformers' weights from the same logits."""
    cfg = C.hf_config(family, small=True, **over)
    blk = C.make_block(family, cfg, "cpu", SEED, dtype=torch.float32)
    d = et.layer_config_from(cfg)
    x = C.tokens(300, cfg.hidden_size, "cpu", SEED + 1).float()
    with torch.no_grad():
        idx, w, logits = C.route(blk, x)
    bias = blk.block.gate.e_score_correction_bias if family == "deepseek_v3" else None
    r_idx, r_w = R.route(R.Router(d["router_mode"], d["num_experts"], d["topk"], d["num_groups"], d["topk_groups"],
                                  d["renormalize"], d["routed_scaling"]), logits.float(), bias)
    tie = C.near_ties(family, cfg, logits.float(), bias)
    ok = C.same_sets(idx, r_idx)
    assert bool((ok | tie).all()), _tag(f"{family}: {int((~ok & ~tie).sum())} tokens routed differently")
    assert int(ok.sum()) >= 250, _tag(f"{family}: only {int(ok.sum())} of 300 tokens comparable")
    # The weights of the tokens routed alike, matched by expert.
    w_sorted = w.float().gather(1, idx.argsort(-1))[ok]
    r_sorted = r_w.gather(1, r_idx.long().argsort(-1))[ok]
    assert torch.allclose(w_sorted, r_sorted, rtol=1e-5, atol=1e-6), _tag(f"{family}: weights")


# -- unsupported experts -----------------------------------------------------------------------

def _experts(family="deepseek_v3", **over):
    cfg = C.hf_config(family, small=True, **over)
    cfg._experts_implementation = "epkit"
    return C.block_class(family)(cfg).eval()


@pytest.mark.parametrize("setup,needle", [
    (lambda b: None, None),
    (lambda b: setattr(b.experts, "has_bias", True), r"bias terms \(has_bias=True\)"),
    (lambda b: setattr(b.experts, "is_concatenated", False), r"interleaved gate/up layout \(is_concatenated=False\)"),
    (lambda b: setattr(b.experts, "is_transposed", False) or setattr(b.experts, "is_transposed", True),
     r"transposed expert weights"),
    (lambda b: setattr(b.experts, "has_gate", False), r"without a gate projection"),
    (lambda b: setattr(b.experts, "act_fn", torch.nn.GELU()), r"the activation GELU"),
])
def test_unsupported_experts_raise_before_any_kernel(ref_backend, setup, needle):
    b = _experts()
    setup(b)
    x = C.tokens(5, b.experts.hidden_dim, "cpu", SEED).float().to(b.experts.gate_up_proj.dtype)
    if needle is None:
        with torch.no_grad():
            b(x[None])
        assert "grouped_gemm" in ref_backend.calls
        return
    with torch.no_grad(), pytest.raises(et.UnsupportedError, match=needle) as e:
        b(x[None])
    assert "DeepseekV3Experts" in str(e.value)
    assert ref_backend.calls == [], "a kernel ran before the error"


def test_unsupported_configs_of_experts(ref_backend):
    with pytest.raises(et.UnsupportedError, match="the activation GELUActivation"):
        et.check_experts(_experts(hidden_act="gelu").experts)
    with pytest.raises(et.UnsupportedError, match="intermediate size 96 is not a multiple of 128"):
        et.check_experts(_experts(moe_intermediate_size=96).experts)
    with pytest.raises(et.UnsupportedError, match=r"Qwen3MoeExperts.*intermediate size 200"):
        et.check_experts(_experts("qwen3_moe", moe_intermediate_size=200).experts)
    assert ref_backend.calls == []


def test_real_unsupported_classes():
    """transformers' own experts that epkit does not compute: GPT-OSS (bias, interleaved gate/up,
    transposed weights, clamped SwiGLU) and Nemotron-H (no gate)."""
    import transformers as tf
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
    cfg = tf.GptOssConfig(hidden_size=256, intermediate_size=256, num_local_experts=4, num_experts_per_tok=2)
    with pytest.raises(et.UnsupportedError, match=r"GptOssExperts.*has_bias=True"):
        et.check_experts(GptOssExperts(cfg))
    from transformers.models.nemotron_h import modeling_nemotron_h as nh
    experts_cls = [c for c in vars(nh).values() if isinstance(c, type) and c.__name__.endswith("Experts")]
    assert experts_cls, "no experts class in nemotron_h"
    ncfg = tf.NemotronHConfig(hidden_size=256, moe_intermediate_size=256, n_routed_experts=4, num_experts_per_tok=2)
    with pytest.raises(et.UnsupportedError, match=r"without a gate projection"):
        et.check_experts(experts_cls[0](ncfg))


def test_patch_moe_rejects_before_replacing(ref_backend):
    import transformers as tf
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP
    gcfg = tf.GptOssConfig(hidden_size=256, intermediate_size=256, num_local_experts=4, num_experts_per_tok=2)
    ok_block = C.block_class("mixtral")(C.hf_config("mixtral", small=True)).eval()
    model = torch.nn.ModuleDict({"a": ok_block, "b": GptOssMLP(gcfg).eval()})
    with pytest.raises(et.UnsupportedError, match=r"GptOssMLP 'b'.*patch_moe converts only"):
        et.patch_moe(model)
    assert model["a"] is ok_block, "a block was replaced although patch_moe raised"
    # On CPU the supported block cannot be converted either: said before anything is made.
    assert et.patch_moe(torch.nn.ModuleDict({"b": GptOssMLP(gcfg).eval()}), skip_unsupported=True) == []
    with pytest.raises(et.UnsupportedError, match=r"MixtralSparseMoeBlock 'a'.*CUDA"):
        et.patch_moe(torch.nn.ModuleDict({"a": ok_block}))
    bad = C.block_class("deepseek_v3")(C.hf_config("deepseek_v3", small=True, norm_topk_prob=False)).eval()
    with pytest.raises(et.UnsupportedError, match="norm_topk_prob=False"):
        et.patch_moe(torch.nn.ModuleDict({"m": bad}))
    train = C.block_class("qwen3_moe")(C.hf_config("qwen3_moe", small=True))
    with pytest.raises(et.UnsupportedError, match="training mode"):
        et.patch_moe(torch.nn.ModuleDict({"m": train}))
    assert ref_backend.calls == []


# -- the experts implementation's logic, on CPU with the reference kernels ---------------------

def _check_experts_output(got, x, idx, w, blk, want_block, tag):
    """The tolerances of the module docstring; returns eps_fp8."""
    emul = C.emulate_experts(x, idx, w, blk.w13, blk.w2)
    eps = C.rel_frob(emul, want_block)
    assert 0.002 < eps < 2 * 2.0 ** -4, _tag(f"{tag}: FP8 emulation vs block {eps:.3g} is not the size of FP8 rounding")
    assert C.rel_frob(got, emul) <= TIGHT_FROB, _tag(f"{tag}: vs emulation {C.rel_frob(got, emul):.3g}")
    assert float(C.row_rel(got, emul).max()) <= TIGHT_ROW, _tag(f"{tag}: row vs emulation")
    err = C.rel_frob(got, want_block)
    assert err <= eps + TIGHT_FROB, _tag(f"{tag}: vs block {err:.4f} > eps_fp8 {eps:.4f} + {TIGHT_FROB}")
    rows = C.row_rel(got, want_block) - C.row_rel(emul, want_block)
    assert float(rows.max()) <= TIGHT_ROW, _tag(f"{tag}: a row is {float(rows.max()):.3g} further from the block "
                                                f"than FP8 rounding explains")
    return eps


@pytest.mark.parametrize("family", C.FAMILIES)
def test_experts_forward_cpu(ref_backend, family):
    cfg = C.hf_config(family, small=True)
    blk = C.make_block(family, cfg, "cpu", SEED)
    H = cfg.hidden_size
    for T in (1, 7, 64):
        x = C.tokens(T, H, "cpu", SEED + T)
        with torch.no_grad():
            idx, w, _ = C.route(blk, x)
            C.set_impl(blk, "eager")
            want = blk.block.experts(x, idx, w)
            C.set_impl(blk, "epkit")
            got = blk.block.experts(x, idx, w)
        assert got.dtype == x.dtype and got.shape == x.shape
        _check_experts_output(got, x, idx, w, blk, want, f"{family} T={T}")
    # The epkit cache is the block's own FP8 weights, code for code (exactly-FP8 weights).
    c = blk.block.experts.__dict__[et._CACHE_ATTR]
    assert c.quantized_here and torch.equal(c.w13.view(torch.uint8), blk.w13.q.view(torch.uint8))
    assert torch.equal(c.w2_scale, blk.w2.scale_inv)


def test_sentinels_and_unpicked_expert_cpu(ref_backend):
    """Indices outside [0, E) (transformers' EP sentinels) add nothing; an expert no token picks is
    never read (its weights are NaN here)."""
    family = "qwen3_moe"
    cfg = C.hf_config(family, small=True)
    blk = C.make_block(family, cfg, "cpu", SEED)
    E, H = cfg.num_experts, cfg.hidden_size
    with torch.no_grad():
        blk.block.experts.gate_up_proj[5] = float("nan")
        blk.block.experts.down_proj[5] = float("nan")
    x = C.tokens(33, H, "cpu", SEED)
    g = torch.Generator().manual_seed(SEED)
    idx = torch.stack([torch.randperm(E - 1, generator=g)[:cfg.num_experts_per_tok] for _ in range(33)])
    idx = torch.where(idx >= 5, idx + 1, idx)  # never expert 5
    w = torch.rand(33, cfg.num_experts_per_tok, generator=g)
    idx[3, 1], idx[10, 0], idx[11] = -1, E, E  # sentinels; token 11 has no expert at all
    with torch.no_grad():
        C.set_impl(blk, "epkit")
        got = blk.block.experts(x, idx, w)
        keep = (idx >= 0) & (idx < E)
        C.set_impl(blk, "eager")
        want = blk.block.experts(x, torch.where(keep, idx, torch.zeros_like(idx)), torch.where(keep, w, 0 * w))
    assert torch.isfinite(got).all(), "NaN from an unpicked expert or a sentinel"
    assert torch.equal(got[11], torch.zeros_like(got[11]))
    # Sentinels cost nothing: the GEMMs computed the valid pairs only.
    assert ref_backend.gemm_rows[-2:] == [int(keep.sum())] * 2, ref_backend.gemm_rows
    blk.w13.q[5].zero_()  # the emulation must not see NaN codes either (never read: any value does)
    _check_experts_output(got, x, torch.where(keep, idx, -1), w, blk, want, "sentinels")


def test_weight_cache_cpu(ref_backend):
    family = "mixtral"
    cfg = C.hf_config(family, small=True)
    blk = C.make_block(family, cfg, "cpu", SEED)
    ex = blk.block.experts
    C.set_impl(blk, "epkit")
    x = C.tokens(9, cfg.hidden_size, "cpu", SEED)
    with torch.no_grad():
        idx, w, _ = C.route(blk, x)
        y0 = ex(x, idx, w)
        y1 = ex(x, idx, w)
        assert ref_backend.calls.count("quantize_weights") == 2, "the weights were quantized again"
        assert torch.equal(y0, y1)
        ex.down_proj.mul_(2)  # in place: the version counter moves
        y2 = ex(x, idx, w)
        assert ref_backend.calls.count("quantize_weights") == 4
        assert C.rel_frob(y2, 2 * y0) < 1e-2, "the in-place change was not seen"
        ex.down_proj = torch.nn.Parameter(ex.down_proj.detach() / 2, requires_grad=False)  # replaced
        y3 = ex(x, idx, w)
        assert ref_backend.calls.count("quantize_weights") == 6 and torch.equal(y3, y0)
        ex.down_proj.data.mul_(2)  # .data: a fresh version counter, by design not seen ...
        assert torch.equal(ex(x, idx, w), y0)
        assert et.invalidate(blk.block) == 1  # ... until invalidate()
        assert C.rel_frob(ex(x, idx, w), 2 * y0) < 1e-2


def test_inference_mode_cpu(ref_backend):
    """Under torch.inference_mode (weights made there have no version counter), then outside it."""
    family = "qwen3_moe"
    cfg = C.hf_config(family, small=True)
    with torch.inference_mode():
        blk = C.make_block(family, cfg, "cpu", SEED)
        C.set_impl(blk, "epkit")
        x = C.tokens(6, cfg.hidden_size, "cpu", SEED)
        idx, w, _ = C.route(blk, x)
        a = blk.block.experts(x, idx, w)
    with torch.no_grad():
        b = blk.block.experts(x.clone(), idx.clone(), w.clone())
    assert torch.equal(a, b) and ref_backend.calls.count("quantize_weights") == 2


def test_fp8_checkpoint_used_as_is_cpu(ref_backend):
    """transformers' FP8Experts (fine-grained FP8 loading: e4m3 weights + 128x128 weight_scale_inv,
    fp32 or UE8M0) runs on its own tensors, not re-quantized: same codes, same output as the bf16
    block holding their dequantised values."""
    from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS, FP8Experts
    from transformers.integrations.moe import use_experts_implementation
    family = "deepseek_v3"
    cfg = C.hf_config(family, small=True)
    blk = C.make_block(family, cfg, "cpu", SEED)
    cls = use_experts_implementation(FP8Experts, experts_interface=ALL_FP8_EXPERTS_FUNCTIONS)
    fp8 = cls(cfg, block_size=(128, 128)).eval()
    with torch.no_grad():
        fp8.gate_up_proj.copy_(blk.w13.q)
        fp8.gate_up_proj_scale_inv.copy_(blk.w13.scale_inv)
        fp8.down_proj.copy_(blk.w2.q)
        fp8.down_proj_scale_inv.copy_(blk.w2.scale_inv)
    cfg._experts_implementation = "epkit"
    x = C.tokens(20, cfg.hidden_size, "cpu", SEED)
    with torch.no_grad():
        idx, w, _ = C.route(blk, x)
        C.set_impl(blk, "epkit")
        want = blk.block.experts(x, idx, w)
        calls = len(ref_backend.calls)
        got = fp8(x, idx, w)
        assert "quantize_weights" not in ref_backend.calls[calls:]
        c = fp8.__dict__[et._CACHE_ATTR]
        assert not c.quantized_here and c.w13.data_ptr() == fp8.gate_up_proj.data_ptr()
        assert torch.equal(got, want)
        if hasattr(torch, "float8_e8m0fnu"):  # UE8M0 scales (powers of two here: exact)
            fp8.gate_up_proj_scale_inv = torch.nn.Parameter(blk.w13.scale_inv.to(torch.float8_e8m0fnu),
                                                            requires_grad=False)
            assert torch.equal(fp8(x, idx, w), want)
    fp8.block_size = (1, 128)
    with pytest.raises(et.UnsupportedError, match="block_size=.1, 128."):
        et.check_experts(fp8)


def test_torch_compile_fullgraph_cpu(ref_backend):
    """The whole experts forward traces with fullgraph=True (no graph break) through epkit's ops, and
    computes what the eager call does; without a prepared cache, compiling says what to do."""
    family = "deepseek_v3"
    cfg = C.hf_config(family, small=True)
    blk = C.make_block(family, cfg, "cpu", SEED)
    C.set_impl(blk, "epkit")
    x = C.tokens(12, cfg.hidden_size, "cpu", SEED)
    torch._dynamo.reset()
    with torch.no_grad():
        idx, w, _ = C.route(blk, x)
        want = blk.block.experts(x, idx, w)  # eager: builds the cache
        f = torch.compile(blk.block.experts, fullgraph=True, backend="aot_eager")
        got = f(x, idx, w)
        assert torch.equal(got, want)
        # The compiled whole block (router + experts + shared expert), too.
        fb = torch.compile(blk.block, fullgraph=True, backend="aot_eager")
        assert torch.equal(fb(x[None]), blk.block(x[None]))
        et.invalidate(blk.block)
        torch._dynamo.reset()
        with pytest.raises(Exception, match="prepare"):
            torch.compile(blk.block.experts, fullgraph=True, backend="aot_eager")(x, idx, w)
        assert et.prepare(blk.block) == ["experts"]
        assert torch.equal(torch.compile(blk.block.experts, fullgraph=True, backend="aot_eager")(x, idx, w), want)
    torch._dynamo.reset()


def test_bucketing():
    """Packed row counts round up by at most 1/8, to at most 16 values per octave."""
    seen = set()
    for n in range(1, 5000):
        r = et._bucket_rows(n)
        assert n <= r <= max(n + n // 8, 16), (n, r)
        seen.add(r)
    assert len([r for r in seen if 2048 <= r < 4096]) <= 8
    assert et._expected_rows(1, 8, 256) == 1 and et._expected_rows(1024, 8, 256) > 32


# -- GPU: the real kernels at the models' sizes ------------------------------------------------

# DeepSeek-V3's 256 experts reduced to 32 (8 groups of 4, 4 kept, top-8) for the default suite's
# time and memory; stress runs all 256.
REAL = {"deepseek_v3": dict(n_routed_experts=32), "qwen3_moe": {}, "mixtral": {}}
FULL = {"deepseek_v3": {}, "qwen3_moe": {}, "mixtral": {}}
gpu_group = pytest.mark.xdist_group("transformers_blocks")  # one worker holds the blocks (GPU memory)


class _Blocks:
    """The GPU blocks of this module, made on first use and kept for its tests."""

    def __init__(self):
        self.made = {}

    def __call__(self, family, full=False):
        key = (family, full)
        if key not in self.made:
            import epkit
            if full:  # make room: the reduced blocks are not needed by the stress tests
                self.made = {k: v for k, v in self.made.items() if k[1]}
                torch.cuda.empty_cache()
            cfg = C.hf_config(family, **(FULL if full else REAL)[family])
            self.made[key] = C.make_block(family, cfg, "cuda", SEED + C.FAMILIES.index(family),
                                          quantize_weights=epkit.quantize_weights)
            torch.cuda.synchronize()
        return self.made[key]

    def drop(self, family, full=False):
        self.made.pop((family, full), None)
        torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def blocks():
    b = _Blocks()
    yield b
    b.made.clear()
    torch.cuda.empty_cache()


def _experts_case(blk, family, T, seed, tag):
    import epkit
    H = blk.cfg.hidden_size
    x = C.tokens(T, H, "cuda", seed)
    with torch.no_grad():
        idx, w, _ = C.route(blk, x)
        C.set_impl(blk, "eager")
        want = blk.block.experts(x, idx, w)
        want_block = blk.block(x[None])[0]
        C.set_impl(blk, "epkit")
        got = blk.block.experts(x, idx, w)
        got_block = blk.block(x[None])[0]
    torch.cuda.synchronize()
    epkit.check_moe_errors()
    assert got.shape == x.shape and got.dtype == torch.bfloat16
    eps = _check_experts_output(got, x, idx, w, blk, want, tag)
    # The whole block (router and shared expert as transformers computes them): no further apart.
    err = C.rel_frob(got_block, want_block)
    assert err <= eps + TIGHT_FROB, _tag(f"{tag}: whole block {err:.4f} vs eps_fp8 {eps:.4f}")
    return eps


def _experts_families(blocks, full, counts):
    for family in C.FAMILIES:
        blk = blocks(family, full)
        for T in counts:
            _experts_case(blk, family, T, SEED + 10 * T, f"{family} experts T={T}")
        c = blk.block.experts.__dict__[et._CACHE_ATTR]
        assert torch.equal(c.w13.view(torch.uint8), blk.w13.q.view(torch.uint8)), f"{family}: cached codes"
        assert torch.equal(c.w2_scale, blk.w2.scale_inv), f"{family}: cached scales"
        del blk, c
        blocks.drop(family, full)


@gpu
@gpu_group
@needs_ext
@pytest.mark.parametrize("family", C.FAMILIES)
def test_experts_gpu(blocks, family):
    """The "epkit" implementation against the block's own experts (same exactly-FP8 weights) and the
    FP8 emulation, with the model's own routing: 1, odd and ~1000 tokens."""
    blk = blocks(family)
    for T in (1, 37, 1000):
        _experts_case(blk, family, T, SEED + 10 * T, f"{family} experts T={T}")
    c = blk.block.experts.__dict__[et._CACHE_ATTR]
    assert torch.equal(c.w13.view(torch.uint8), blk.w13.q.view(torch.uint8)), f"{family}: cached codes"
    assert torch.equal(c.w2_scale, blk.w2.scale_inv), f"{family}: cached scales"


@gpu
@gpu_group
@needs_ext
@stress
def test_experts_gpu_full_size(blocks):
    """DeepSeek-V3 with all 256 experts (and the other two again), up to 4096 tokens."""
    _experts_families(blocks, True, (1, 999, 4096))


@gpu
@gpu_group
@needs_ext
def test_unpicked_expert_and_sentinels_gpu(blocks):
    """~1000 tokens that never pick expert 5 (whose weights are NaN: a read would show) with some
    "no expert" sentinels; the weight change is seen through the version counter."""
    import epkit
    family = "qwen3_moe"
    blk = blocks(family)
    ex = blk.block.experts
    E, K, H = blk.cfg.num_experts, blk.cfg.num_experts_per_tok, blk.cfg.hidden_size
    T = 999
    x = C.tokens(T, H, "cuda", SEED + 5)
    g = torch.Generator(device="cuda").manual_seed(SEED + 5)
    idx = torch.rand(T, E - 1, generator=g, device="cuda").argsort(-1)[:, :K]
    idx = torch.where(idx >= 5, idx + 1, idx)
    w = torch.rand(T, K, generator=g, device="cuda")
    idx[::7, 2] = -1
    idx[1::11, 0] = E
    keep = (idx >= 0) & (idx < E)
    C.set_impl(blk, "epkit")
    with torch.no_grad():
        ex(x[:1], idx[:1], w[:1])
    before = ex.__dict__[et._CACHE_ATTR]
    try:
        with torch.no_grad():
            ex.gate_up_proj[5] = float("nan")
            ex.down_proj[5] = float("nan")
            got = ex(x, idx, w)
            C.set_impl(blk, "eager")
            want = ex(x, torch.where(keep, idx, 0), torch.where(keep, w, 0))
        torch.cuda.synchronize()
        epkit.check_moe_errors()
        assert ex.__dict__[et._CACHE_ATTR] is not before, "the in-place weight change was not seen"
        assert torch.isfinite(got).all(), "NaN from the unpicked expert or a sentinel"
        q13 = C.Fp8(blk.w13.q.clone(), blk.w13.scale_inv, None)
        q13.q[5].zero_()  # the emulation reads no NaN code either
        blk13 = C.Block(blk.block, blk.cfg, q13, blk.w2, None, None)
        _check_experts_output(got, x, torch.where(keep, idx, -1), w, blk13, want, "unpicked expert + sentinels")
    finally:
        with torch.no_grad():
            ex.gate_up_proj[5] = C.dequant(blk.w13, 5)
            ex.down_proj[5] = C.dequant(blk.w2, 5)


@gpu
@gpu_group
@needs_ext
def test_experts_cuda_graph_gpu(blocks):
    """The experts forward captured in one CUDA graph (64 token rows) and replayed with new tokens
    and routing, including replays where only 17 or 1 of the rows are routed (the others "no
    expert"): each replay equals the eager call on the same inputs, bit for bit."""
    import epkit
    family = "deepseek_v3"
    blk = blocks(family)
    ex = blk.block.experts
    H, E = blk.cfg.hidden_size, blk.cfg.n_routed_experts
    C.set_impl(blk, "epkit")
    x_buf = C.tokens(64, H, "cuda", SEED + 64)
    with torch.no_grad():
        idx_buf, w_buf, _ = C.route(blk, x_buf)
        ex(x_buf, idx_buf, w_buf)  # builds the cache and the GEMM objects of this row count
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ex(x_buf, idx_buf, w_buf)
        for it, routed in enumerate((64, 17, 1, 64)):
            x = C.tokens(64, H, "cuda", SEED + 100 + it)
            idx, w, _ = C.route(blk, x)
            idx = idx.clone()
            idx[routed:] = -1 if it % 2 else E
            x_buf.copy_(x), idx_buf.copy_(idx), w_buf.copy_(w)
            graph.replay()
            torch.cuda.synchronize()
            want = ex(x, idx, w)
            torch.cuda.synchronize()
            tag = _tag(f"graph replay {it}: {routed} routed rows")
            assert torch.equal(out, want), tag
            assert not out[routed:].any(), f"{tag}: unrouted rows"
            C.set_impl(blk, "eager")
            ref = ex(x[:routed], idx[:routed], w[:routed])
            C.set_impl(blk, "epkit")
            _check_experts_output(out[:routed], x[:routed], idx[:routed], w[:routed], blk, ref, tag)
        del graph
    epkit.check_moe_errors()


@gpu
@gpu_group
@needs_ext
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=stress)])
def test_torch_compile_gpu(blocks, backend):
    """The whole transformers block compiled with fullgraph=True (no graph break: epkit's kernels
    are custom ops) computes what the eager block does."""
    family = "mixtral"
    blk = blocks(family)
    C.set_impl(blk, "epkit")
    x = C.tokens(37, blk.cfg.hidden_size, "cuda", SEED + 37)[None]
    torch._dynamo.reset()
    with torch.no_grad():
        want = blk.block(x)
        got = torch.compile(blk.block, fullgraph=True, backend=backend)(x)
    torch.cuda.synchronize()
    err = C.rel_frob(got, want)
    assert err <= (1e-3 if backend == "aot_eager" else TIGHT_FROB), _tag(f"{backend}: {err:.3g}")
    torch._dynamo.reset()


@gpu
@gpu_group
@needs_ext
def test_fp8_checkpoint_gpu(blocks):
    """An FP8Experts module (a fine-grained FP8 checkpoint) runs on its own e4m3 tensors and
    weight_scale_inv, not re-quantized: the same output as the bf16 block of their dequantised values."""
    from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS, FP8Experts
    from transformers.integrations.moe import use_experts_implementation
    blk = blocks("deepseek_v3")
    cls = use_experts_implementation(FP8Experts, experts_interface=ALL_FP8_EXPERTS_FUNCTIONS)
    with torch.device("cuda"):
        fp8 = cls(blk.cfg, block_size=(128, 128)).eval()
    with torch.no_grad():
        fp8.gate_up_proj.copy_(blk.w13.q)
        fp8.gate_up_proj_scale_inv.copy_(blk.w13.scale_inv)
        fp8.down_proj.copy_(blk.w2.q)
        fp8.down_proj_scale_inv.copy_(blk.w2.scale_inv)
        C.set_impl(blk, "epkit")
        x = C.tokens(300, blk.cfg.hidden_size, "cuda", SEED + 300)
        idx, w, _ = C.route(blk, x)
        want = blk.block.experts(x, idx, w)
        got = fp8(x, idx, w)
    torch.cuda.synchronize()
    c = fp8.__dict__[et._CACHE_ATTR]
    assert not c.quantized_here and c.w13.data_ptr() == fp8.gate_up_proj.data_ptr()
    assert torch.equal(got, want)


# -- GPU: patch_moe ----------------------------------------------------------------------------

def _layer_pass(new, x):
    """new's layer over x [T, H] chunk by chunk as its forward splits it: (out, topk_idx, topk_weights,
    logits) with the layer's own routing of every token."""
    outs, idxs, ws, lgs = [], [], [], []
    for i in range(0, x.shape[0], new.max_tokens):
        xi = x[i:i + new.max_tokens].contiguous()
        outs.append(new.layer.forward(xi))
        r = new.layer.routing()
        m = xi.shape[0]
        idxs.append(r.topk_idx[:m].clone()), ws.append(r.topk_weights[:m].clone()), lgs.append(r.logits[:m].clone())
    return torch.cat(outs), torch.cat(idxs), torch.cat(ws), torch.cat(lgs)


def _patch_case(blk, family, new, T, seed, tag):
    import epkit
    H = blk.cfg.hidden_size
    x = C.tokens(T, H, "cuda", seed)
    with torch.no_grad():
        got = new(x[None])[0]
        out, idx_e, w_e, lg_e = _layer_pass(new, x)
        C.set_impl(blk, "eager")
        want = blk.block(x[None])[0]
        idx_t, w_t, _ = C.route(blk, x)
    torch.cuda.synchronize()
    new.layer.check()
    epkit.check_moe_errors()
    assert torch.equal(got, out), f"{tag}: the chunked forward differs from its chunks"
    bias = blk.block.gate.e_score_correction_bias if family == "deepseek_v3" else None
    tie = C.near_ties(family, blk.cfg, lg_e, bias)
    same = C.same_sets(idx_e, idx_t)
    assert bool((same | tie).all()), _tag(f"{tag}: {int((~same & ~tie).sum())} of {T} tokens routed differently "
                                          f"away from near-ties")
    if T >= 20:  # near-ties are rare: most tokens must be comparable
        assert int(same.sum()) >= 0.9 * T, _tag(f"{tag}: only {int(same.sum())} of {T} tokens routed alike")
    # Router weights, matched by expert. DeepSeek-V3: both fp32 from the same products (1e-4).
    # Softmax: transformers' logits are bf16 (each within 2^-9 |l|), and a weight's relative error
    # is that of its own logit minus the weighted mean of the others': within 2^-8 max|l| (Qwen3-MoE
    # then rounds the weight to bf16: 2^-9 more).
    we = w_e.gather(1, idx_e.long().argsort(-1))[same].double()
    wt = w_t.double().gather(1, idx_t.argsort(-1))[same]
    rtol = 1e-4 if family == "deepseek_v3" else 2.0 ** -8 * lg_e[same].abs().amax(-1, keepdim=True).double() + 2.0 ** -9
    bad = (we - wt).abs() > rtol * wt.abs() + 1e-6
    assert not bad.any(), _tag(f"{tag}: router weights of {int(bad.any(-1).sum())} tokens")
    # The emulation of the layer on its own routing: routed experts + shared expert, both FP8.
    emul = C.emulate_experts(x, idx_e, w_e, blk.w13, blk.w2)
    if blk.shared13 is not None:
        emul = (emul.float() + C.emulate_shared(x, blk.shared13, blk.shared2).float()).to(torch.bfloat16)
    assert C.rel_frob(got, emul) <= TIGHT_FROB, _tag(f"{tag}: vs emulation {C.rel_frob(got, emul):.3g}")
    assert float(C.row_rel(got, emul).max()) <= TIGHT_ROW, _tag(f"{tag}: a row vs emulation")
    # Against the transformers block (same weights), on the tokens routed alike.
    if not same.any():
        return
    eps = C.rel_frob(emul[same], want[same])
    assert 0.002 < eps < 2 * 2.0 ** -4, _tag(f"{tag}: FP8 emulation vs block {eps:.3g}")
    err = C.rel_frob(got[same], want[same])
    assert err <= eps + TIGHT_FROB, _tag(f"{tag}: vs block {err:.4f} > eps_fp8 {eps:.4f} + {TIGHT_FROB}")
    rows = C.row_rel(got[same], want[same]) - C.row_rel(emul[same], want[same])
    assert float(rows.max()) <= TIGHT_ROW, _tag(f"{tag}: a row further from the block than FP8 rounding explains")


@gpu
@gpu_group
@needs_ext
@pytest.mark.parametrize("family", C.FAMILIES)
def test_patch_moe_gpu(blocks, family):
    """patch_moe swaps the block for one epkit.MoELayer (world size 1, no NVSHMEM bootstrap here):
    routing equal to transformers' away from near-ties, output against the block on the tokens
    routed alike and against the FP8 emulation; 1, odd and ~1000 tokens (4 chunks of 256)."""
    blk = blocks(family)
    model = torch.nn.ModuleDict({"mlp": blk.block})
    assert et.patch_moe(model, max_tokens=256) == ["mlp"]
    new = model["mlp"]
    try:
        assert isinstance(new, et.EpkitMoEBlock) and new.family == family
        assert new.layer.weights["w13"] is blk.block.experts.__dict__[et._CACHE_ATTR].w13, "the FP8 cache was copied"
        for T in (1, 37, 1000):
            _patch_case(blk, family, new, T, SEED + 20 * T, f"{family} patch_moe T={T}")
    finally:
        new.destroy()


@gpu
@gpu_group
@needs_ext
def test_patch_moe_unpicked_expert_gpu(blocks):
    """DeepSeek-V3 whose expert 5 neither router picks (correction bias -1e4) and whose weights are
    NaN: the layer never reads them."""
    blk = blocks("deepseek_v3")
    gate, ex = blk.block.gate, blk.block.experts
    b5 = float(gate.e_score_correction_bias[5])
    try:
        with torch.no_grad():
            gate.e_score_correction_bias[5] = -1e4
            ex.gate_up_proj[5] = float("nan")
            ex.down_proj[5] = float("nan")
        new = et.convert_block(blk.block, max_tokens=256)
        try:
            x = C.tokens(256, blk.cfg.hidden_size, "cuda", SEED + 7)
            with torch.no_grad():
                got = new(x[None])[0]
            torch.cuda.synchronize()
            new.layer.check()
            assert not (new.layer.routing().topk_idx[:256] == 5).any()
            assert torch.isfinite(got).all(), "NaN from the unpicked expert"
        finally:
            new.destroy()
    finally:
        with torch.no_grad():
            gate.e_score_correction_bias[5] = b5
            ex.gate_up_proj[5] = C.dequant(blk.w13, 5)
            ex.down_proj[5] = C.dequant(blk.w2, 5)


@gpu
@gpu_group
@needs_ext
def test_patch_moe_cuda_graph_gpu(blocks):
    """One CUDA graph of the patched DeepSeek-V3 block (64 rows, m on the device) replayed for
    m = 17, 1 and 64: each equals the eager forward of the first m tokens (within accumulation
    order: with m on the host the layer may pick another GEMM config)."""
    import epkit
    blk = blocks("deepseek_v3")
    new = et.convert_block(blk.block, max_tokens=64)
    try:
        H = blk.cfg.hidden_size
        x_buf = C.tokens(64, H, "cuda", SEED + 640)
        m_dev = torch.tensor([64], dtype=torch.int32, device="cuda")
        with torch.no_grad():
            new(x_buf, num_tokens=m_dev)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = new(x_buf, num_tokens=m_dev)
            for it, m in enumerate((17, 1, 64)):
                x = C.tokens(64, H, "cuda", SEED + 650 + it)
                x_buf.copy_(x)
                m_dev.fill_(m)
                graph.replay()
                torch.cuda.synchronize()
                want = new(x[:m])
                torch.cuda.synchronize()
                tag = _tag(f"patched graph replay m={m}")
                assert C.rel_frob(out[:m], want) <= TIGHT_FROB, tag
                assert float(C.row_rel(out[:m], want).max()) <= TIGHT_ROW, tag
            del graph
        new.layer.check()
        epkit.check_moe_errors()
    finally:
        new.destroy()


@gpu
@gpu_group
@needs_ext
@stress
def test_patch_moe_full_size(blocks):
    for family in C.FAMILIES:
        blk = blocks(family, True)
        new = et.convert_block(blk.block, max_tokens=1024)
        try:
            for T in (1, 999, 4096):
                _patch_case(blk, family, new, T, SEED + 30 * T, f"{family} (full) patch_moe T={T}")
        finally:
            new.destroy()
            del new, blk
            blocks.drop(family, True)
