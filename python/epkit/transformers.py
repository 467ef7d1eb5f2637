"""epkit as a Hugging Face transformers experts implementation, and whole MoE blocks as epkit.MoELayer.

Two ways in, both on one GPU with no NVSHMEM bootstrap in user code:

1. The experts implementation "epkit" (registered in transformers' ExpertsInterface, and in the
   FP8 one, when this module is imported; register() does it explicitly and idempotently)::

       import epkit.transformers
       model = AutoModelForCausalLM.from_pretrained(..., experts_implementation="epkit")
       # or model.set_experts_implementation("epkit")

   The model's own router still chooses the experts (top_k_index, top_k_weights), so the routing
   semantics stay transformers'. epkit computes the routed experts in FP8: the expert weights
   (gate_up_proj [E, 2I, H], gate rows first; down_proj [E, H, I]) are quantized to e4m3 with one
   fp32 scale per 128x128 tile once, on first use, and cached on the module (a checkpoint that is
   already FP8 with 128x128 weight_scale_inv is used as it is). Each call then runs, on the current
   stream and with no host synchronisation (capturable in a CUDA graph, traced by torch.compile
   through epkit's custom ops without graph breaks):

       quantize x (1x128 blocks) -> gather into the packed expert-major layout -> grouped GEMM
       (gate_up) -> SiLU(gate) * up + quantize -> grouped GEMM (down) -> weighted sum over top-k

   The packed layout's permutation is built on the device from top_k_index (a stable sort by
   expert; offsets by searchsorted). Indices outside [0, E) are treated as "no expert" (the
   sentinels transformers' expert parallelism writes): they cost nothing and add nothing.

2. patch_moe(model): each supported MoE block (router + routed experts + shared expert) becomes
   one epkit.MoELayer at world size 1, built from the block's weights, with the block's routing
   semantics mapped onto epkit's router (layer_config_from). Supported blocks, by class:
   DeepseekV3MoE, Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock.

Anything epkit does not compute (another activation, bias terms, an interleaved or transposed
gate/up layout, an intermediate size that is not a multiple of 128, a router mode epkit lacks, ...)
raises UnsupportedError naming what and the module, before any kernel runs.

The weight cache. The FP8 copy is rebuilt when a source weight changes: the cache key holds each
source tensor's identity, data_ptr, _version (bumped by every in-place op on the parameter or a
view of it: optimizer steps, load_state_dict, param.copy_() under no_grad), device, dtype and
shape. Edits through `param.data` use a fresh version counter and are not seen: call
invalidate(model) after those. Under torch.compile the key is not checked (Dynamo cannot trace
data_ptr): the cache must exist before tracing (one eager forward, or prepare(model)); a cache
rebuilt later by an eager call makes Dynamo's guards on it fail, so the graph is retraced.

This module imports transformers but not epkit's compiled extension: registration and the config
mapping work without it; the kernels are imported on first use.
"""

import dataclasses
import math
import weakref
from typing import Any, Dict, List, Optional, Tuple

try:
    import torch
    import transformers as _hf
    from transformers.integrations import moe as _hf_moe
except ImportError as _e:  # pragma: no cover - exercised by the tests with transformers hidden
    raise ImportError(
        "epkit.transformers needs Hugging Face transformers (v5, with transformers.integrations.moe."
        f"ExpertsInterface): pip install 'epkit[transformers]' (or pip install 'transformers>=5'). ({_e})") from _e

if not hasattr(_hf_moe, "ExpertsInterface"):  # pragma: no cover
    raise ImportError(f"epkit.transformers needs transformers v5 (ExpertsInterface in transformers.integrations.moe); "
                      f"this is transformers {_hf.__version__}: pip install 'epkit[transformers]'")

IMPLEMENTATION = "epkit"
SCALE_BLOCK = 128
FP8 = torch.float8_e4m3fn

__all__ = ["IMPLEMENTATION", "UnsupportedError", "ExpertsSpec", "register", "registered", "experts_forward",
           "check_experts", "prepare", "invalidate", "layer_config_from", "convert_block", "patch_moe",
           "EpkitMoEBlock", "SUPPORTED_BLOCKS"]


class UnsupportedError(NotImplementedError):
    """A module or config asks for something epkit does not compute. Raised before any kernel runs."""


# -- the kernels (imported on first use) --------------------------------------------------------

class _Backend:
    """The four expert-compute ops the forward calls, and whether they need CUDA tensors. The
    default is epkit.moe (the compiled extension, imported on first use); the CPU tests put a torch
    reference of the same ops here (_use_backend) to check this module's own logic."""

    requires_cuda = True

    def __init__(self):
        from . import moe  # epkit._C: the compiled extension
        self.quantize = moe.quantize
        self.quantize_weights = moe.quantize_weights
        self.grouped_gemm = moe.grouped_gemm
        self.silu_mul_quantize = moe.silu_mul_quantize


_backend: Optional[Any] = None


def _ops():
    global _backend
    if _backend is None:
        _backend = _Backend()
    return _backend


def _use_backend(backend) -> Any:
    """Test seam: replace the kernels (None: back to epkit.moe). Returns the previous backend."""
    global _backend
    old, _backend = _backend, backend
    return old


def _compiling() -> bool:
    c = getattr(torch, "compiler", None)
    return bool(c is not None and hasattr(c, "is_compiling") and c.is_compiling())


# -- names for messages -------------------------------------------------------------------------

_names: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()


def _describe(module) -> str:
    name = _names.get(module) if isinstance(module, torch.nn.Module) else None
    return f"{type(module).__name__} '{name}'" if name else type(module).__name__


def _name_modules(root: torch.nn.Module) -> None:
    for name, m in root.named_modules():
        if name:
            _names[m] = name


# -- which experts modules epkit computes -------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ExpertsSpec:
    """What epkit needs to know about one experts module (check_experts returns it)."""

    num_experts: int   # E
    hidden: int        # H
    intermediate: int  # I
    fp8: bool          # the module's weights are already e4m3 with 128x128 weight_scale_inv


def _is_silu(act) -> bool:
    from transformers.activations import SiLUActivation
    return isinstance(act, (torch.nn.SiLU, SiLUActivation))


def _fp8_experts_class():
    try:
        from transformers.integrations.finegrained_fp8 import FP8Experts
        return FP8Experts
    except Exception:  # noqa: BLE001 - an older or trimmed transformers: no FP8 experts to recognise
        return None


def _unsupported(module, what: str) -> UnsupportedError:
    return UnsupportedError(f"epkit cannot compute the experts of {_describe(module)}: {what}")


def check_experts(module: torch.nn.Module) -> ExpertsSpec:
    """Raises UnsupportedError naming what epkit does not compute in this experts module (a class
    decorated with transformers' @use_experts_implementation, or its FP8 twin), else returns its
    ExpertsSpec. Runs no kernel."""
    if getattr(module, "has_gate", True) is not True:
        raise _unsupported(module, "experts without a gate projection (has_gate=False, up_proj only); epkit "
                                   "computes gated SwiGLU experts (gate_up_proj)")
    if getattr(module, "has_bias", False):
        raise _unsupported(module, "bias terms (has_bias=True); epkit's grouped GEMMs take no bias")
    if getattr(module, "is_concatenated", True) is not True:
        raise _unsupported(module, "an interleaved gate/up layout (is_concatenated=False); epkit needs "
                                   "gate_up_proj as [gate rows; up rows]")
    if getattr(module, "is_transposed", False):
        raise _unsupported(module, "transposed expert weights (is_transposed=True); epkit needs gate_up_proj "
                                   "[E, 2I, H] and down_proj [E, H, I]")
    fp8_cls = _fp8_experts_class()
    is_fp8_module = fp8_cls is not None and isinstance(module, fp8_cls)
    if is_fp8_module:
        if getattr(module, "swiglu_alpha", None) is not None or getattr(module, "limit", None) is not None:
            raise _unsupported(module, "a clamped SwiGLU (swiglu_alpha / swiglu_limit); epkit computes silu(gate) * up")
        if getattr(module, "activation_scheme", "dynamic") != "dynamic":
            raise _unsupported(module, f"activation_scheme={module.activation_scheme!r}; epkit quantizes activations "
                                       "dynamically (1x128 blocks)")
    elif getattr(type(module), "_apply_gate", None) is not getattr(_hf_moe, "_default_apply_gate", False):
        raise _unsupported(module, f"a custom gate ({type(module).__name__}._apply_gate); epkit computes "
                                   "act(gate) * up with gate = the first half")
    act = getattr(module, "act_fn", None)
    if not _is_silu(act):
        raise _unsupported(module, f"the activation {type(act).__name__} (hidden_act); epkit computes SiLU only")
    w13, w2 = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(w13, torch.Tensor) or not isinstance(w2, torch.Tensor):
        raise _unsupported(module, "no gate_up_proj / down_proj tensors")
    if w13.dim() != 3 or w2.dim() != 3 or w13.shape[1] % 2:
        raise _unsupported(module, f"gate_up_proj {tuple(w13.shape)} / down_proj {tuple(w2.shape)} are not "
                                   "[E, 2I, H] / [E, H, I]")
    E, two_i, H = (int(d) for d in w13.shape)
    inter = two_i // 2
    if tuple(w2.shape) != (E, H, inter):
        raise _unsupported(module, f"down_proj is {tuple(w2.shape)} but gate_up_proj {tuple(w13.shape)} needs "
                                   f"[{E}, {H}, {inter}]")
    if inter % SCALE_BLOCK:
        raise _unsupported(module, f"intermediate size {inter} is not a multiple of {SCALE_BLOCK} (FP8 block "
                                   "scales and the grouped GEMM's K)")
    if H % SCALE_BLOCK:
        raise _unsupported(module, f"hidden size {H} is not a multiple of {SCALE_BLOCK}")
    if E > 1024:
        raise _unsupported(module, f"{E} experts; epkit's grouped GEMM takes at most 1024 groups")
    fp8 = w13.dtype == FP8
    if (w2.dtype == FP8) != fp8:
        raise _unsupported(module, f"gate_up_proj is {w13.dtype} but down_proj is {w2.dtype}")
    if fp8:
        _fp8_scales(module, E, H, inter)  # raises when the scales are not 128x128 tiles
    elif not w13.is_floating_point() or w13.dtype.itemsize < 2:
        raise _unsupported(module, f"expert weights of dtype {w13.dtype}; epkit takes bf16, fp16 or fp32 weights "
                                   "(quantized once) or e4m3 with 128x128 weight_scale_inv")
    return ExpertsSpec(E, H, inter, fp8)


def _fp8_scales(module, E: int, H: int, inter: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The weight_scale_inv of an FP8 experts module, checked to be 128x128 tiles."""
    block = getattr(module, "block_size", None)
    if block is None or tuple(int(b) for b in block) != (SCALE_BLOCK, SCALE_BLOCK):
        raise _unsupported(module, f"FP8 weights with block_size={block}; epkit takes 128x128 weight scale tiles "
                                   "(DeepSeek-V3's weight_scale_inv)")
    s13, s2 = getattr(module, "gate_up_proj_scale_inv", None), getattr(module, "down_proj_scale_inv", None)
    nb = lambda n: (n + SCALE_BLOCK - 1) // SCALE_BLOCK  # noqa: E731
    for name, s, want in (("gate_up_proj_scale_inv", s13, (E, nb(2 * inter), nb(H))),
                          ("down_proj_scale_inv", s2, (E, nb(H), nb(inter)))):
        if not isinstance(s, torch.Tensor) or tuple(s.shape) != want:
            got = tuple(s.shape) if isinstance(s, torch.Tensor) else s
            raise _unsupported(module, f"{name} is {got}, not the 128x128 tiles {want}")
        if s.dtype not in (torch.float32, getattr(torch, "float8_e8m0fnu", torch.float32)):
            raise _unsupported(module, f"{name} of dtype {s.dtype}; epkit takes fp32 (or UE8M0) scales")
    return s13, s2


# -- the FP8 weight cache -----------------------------------------------------------------------

@dataclasses.dataclass
class _Cached:
    key: tuple
    spec: ExpertsSpec
    w13: torch.Tensor        # [E, 2I, H] e4m3
    w13_scale: torch.Tensor  # [E, 2I/128, H/128] fp32 (dequant = q * scale_inv per tile)
    w2: torch.Tensor         # [E, H, I] e4m3
    w2_scale: torch.Tensor   # [E, H/128, I/128] fp32
    quantized_here: bool     # False: the checkpoint's own FP8 tensors


_CACHE_ATTR = "_epkit_fp8_experts"


def _sources(module, spec: ExpertsSpec) -> List[torch.Tensor]:
    ts = [module.gate_up_proj, module.down_proj]
    if spec.fp8:
        ts += [module.gate_up_proj_scale_inv, module.down_proj_scale_inv]
    return ts


def _key(module) -> tuple:
    """Cheap and exact enough: what changes when a weight is replaced, moved or edited in place."""
    attrs = (getattr(module, "has_gate", True), getattr(module, "has_bias", False),
             getattr(module, "is_concatenated", True), getattr(module, "is_transposed", False),
             type(getattr(module, "act_fn", None)))
    ts = []
    for name in ("gate_up_proj", "down_proj", "gate_up_proj_scale_inv", "down_proj_scale_inv"):
        t = getattr(module, name, None)
        if isinstance(t, torch.Tensor):
            try:
                version = t._version
            except RuntimeError:  # an inference tensor (made under torch.inference_mode) has no version counter
                version = None
            ts.append((name, id(t), t.data_ptr(), version, t.device, t.dtype, tuple(t.shape)))
    return attrs + tuple(ts)


def _build(module, key: tuple) -> _Cached:
    spec = check_experts(module)
    if spec.fp8:
        s13, s2 = _fp8_scales(module, spec.num_experts, spec.hidden, spec.intermediate)
        return _Cached(key, spec, module.gate_up_proj.detach().contiguous(), s13.detach().float().contiguous(),
                       module.down_proj.detach().contiguous(), s2.detach().float().contiguous(), False)
    ops = _ops()
    dev = module.gate_up_proj.device
    if ops.requires_cuda and dev.type != "cuda":
        raise _unsupported(module, f"weights on {dev}; epkit's kernels run on CUDA devices")
    with torch.no_grad():
        q13 = ops.quantize_weights(module.gate_up_proj.detach().to(torch.bfloat16).contiguous())
        q2 = ops.quantize_weights(module.down_proj.detach().to(torch.bfloat16).contiguous())
    return _Cached(key, spec, q13.q, q13.scale_inv, q2.q, q2.scale_inv, True)


def _cached(module) -> _Cached:
    """The module's FP8 weights, built on first use and rebuilt when a source weight changed."""
    c = module.__dict__.get(_CACHE_ATTR)
    if _compiling():
        if c is None:
            raise RuntimeError(
                f"epkit: the FP8 weights of {_describe(module)} are not prepared, and torch.compile cannot build "
                "them inside a traced graph: run one eager forward or epkit.transformers.prepare(model) before "
                "compiling")
        return c
    key = _key(module)
    if c is None or c.key != key:
        c = None
        module.__dict__.pop(_CACHE_ATTR, None)  # free the stale copy before building the new one
        c = _build(module, key)
        module.__dict__[_CACHE_ATTR] = c
    return c


def invalidate(root: torch.nn.Module) -> int:
    """Drops the cached FP8 weights of root and every experts module under it (the next forward
    rebuilds them). Returns how many caches were dropped."""
    n = 0
    for m in root.modules():
        if m.__dict__.pop(_CACHE_ATTR, None) is not None:
            n += 1
    return n


def _experts_modules(root: torch.nn.Module):
    for name, m in root.named_modules():
        if isinstance(getattr(m, "gate_up_proj", None), torch.Tensor) and hasattr(m, "down_proj") \
                and hasattr(type(m), "_apply_gate"):
            yield name, m


def prepare(root: torch.nn.Module) -> List[str]:
    """Checks and quantizes (or takes the FP8 checkpoint tensors of) every experts module under
    root now, instead of on first use: what torch.compile needs before tracing, and a way to see
    every unsupported module at once. Returns the names of the modules prepared."""
    _name_modules(root)
    mods = list(_experts_modules(root))
    problems = []
    for name, m in mods:
        try:
            check_experts(m)
        except UnsupportedError as e:
            problems.append(str(e))
    if problems:
        raise UnsupportedError("; ".join(problems))
    for _, m in mods:
        _cached(m)
    return [name for name, _ in mods]


# -- the forward --------------------------------------------------------------------------------

def _bucket_rows(n: int) -> int:
    """Rows of the packed buffers for n token-expert pairs: n rounded up to 8..16 steps per octave
    (at most 1/8 more rows), so that the grouped GEMM objects (one per row count, made on first use)
    stay few however the batch size varies."""
    n = max(int(n), 1)
    step = 1 << max(0, n.bit_length() - 4)
    return -(-n // step) * step


def _expected_rows(tokens: int, topk: int, num_experts: int) -> int:
    """Rows per expert the GEMM config is chosen for: the expected largest count under uniform
    routing, mean + sqrt(2 mean ln E) (what epkit::MoELayer uses)."""
    mean = tokens * topk / num_experts
    return max(1, math.ceil(mean + math.sqrt(2.0 * mean * math.log(max(num_experts, 1)))))


def routed_experts(w: _Cached, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                   top_k_weights: torch.Tensor) -> torch.Tensor:
    """out[t] = sum_k top_k_weights[t, k] * expert_{top_k_index[t, k]}(hidden_states[t]) in FP8,
    with w's weights; indices outside [0, E) add nothing."""
    ops = _ops()
    T, H = hidden_states.shape
    K = top_k_index.shape[-1]
    E = w.spec.num_experts
    if H != w.spec.hidden:
        raise ValueError(f"epkit experts: hidden_states has {H} features but the experts take {w.spec.hidden}")
    if T == 0 or K == 0:
        return torch.zeros_like(hidden_states)
    dev = hidden_states.device
    S = T * K
    R = _bucket_rows(S)
    em = _expected_rows(R // K, K, E)

    # Routing -> packed expert-major permutation, on the device. Pair p = t * K + k. Sorted stably
    # by expert (sentinels, mapped to E, last), pair order[j] fills packed row j; expert e's rows are
    # [offsets[e], offsets[e + 1]).
    ids = top_k_index.reshape(S)
    valid = (ids >= 0) & (ids < E)
    ids = torch.where(valid, ids, torch.full_like(ids, E))
    sorted_ids, order = torch.sort(ids, stable=True)
    bounds = torch.arange(E + 1, device=dev, dtype=sorted_ids.dtype)
    offsets = torch.searchsorted(sorted_ids, bounds, out_int32=True)  # [E + 1]: pairs with expert < e
    counts = offsets[1:] - offsets[:-1]                                 # [E] int32
    src = torch.nn.functional.pad(order // K, (0, R + 1 - S))           # token of each packed row (pad: token 0)

    x = hidden_states if hidden_states.dtype == torch.bfloat16 else hidden_states.to(torch.bfloat16)
    xq = ops.quantize(x.contiguous())                                   # [T, H] e4m3 + [T, H/128] fp32
    a = xq.q.view(torch.uint8).index_select(0, src).view(FP8)           # [R + 1, H]: row R is in no group
    a_scale = xq.scale.index_select(0, src)
    h = ops.grouped_gemm(a, a_scale, w.w13, w.w13_scale, counts, offsets, expected_m=em)   # [R + 1, 2I] bf16
    act = ops.silu_mul_quantize(h, counts, offsets)                                      # [R + 1, I] e4m3
    y = ops.grouped_gemm(act.q, act.scale, w.w2, w.w2_scale, counts, offsets, expected_m=em)  # [R + 1, H] bf16
    y[R].zero_()  # the row "no expert" pairs read: no GEMM writes it

    # Weighted sum over top-k, in fp32, reading each pair's row of the packed output.
    pos = torch.empty_like(order).scatter_(0, order, torch.arange(S, device=dev, dtype=order.dtype))
    pos = torch.where(valid, pos, torch.full_like(pos, R))
    wk = torch.where(valid, top_k_weights.reshape(S).float(), torch.zeros((), device=dev, dtype=torch.float32))
    yk = y.index_select(0, pos).view(T, K, H)
    out = (yk * wk.view(T, K, 1)).sum(dim=1)
    return out.to(hidden_states.dtype)


def experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The "epkit" experts implementation: forward(hidden_states [T, H], top_k_index [T, K],
    top_k_weights [T, K]) -> [T, H] of an experts module, computed by epkit's FP8 kernels."""
    if self.training and torch.is_grad_enabled():
        raise UnsupportedError(f"epkit computes no gradients ({_describe(self)} is in training mode with grad "
                               "enabled): call model.eval() or run under torch.no_grad()")
    w = _cached(self)
    ops = _ops()
    if ops.requires_cuda and hidden_states.device.type != "cuda":
        raise _unsupported(self, f"hidden_states on {hidden_states.device}; epkit's kernels run on CUDA devices")
    if w.w13.device != hidden_states.device:
        raise ValueError(f"epkit experts: {_describe(self)}'s weights are on {w.w13.device} but hidden_states on "
                         f"{hidden_states.device}")
    return routed_experts(w, hidden_states, top_k_index, top_k_weights)


# -- registration -------------------------------------------------------------------------------

def _interfaces():
    out = [_hf_moe.ExpertsInterface]
    try:
        from transformers.integrations.finegrained_fp8 import FP8ExpertsInterface
        out.append(FP8ExpertsInterface)
    except Exception:  # noqa: BLE001 - no FP8 experts in this transformers
        pass
    return out


def register() -> None:
    """Registers experts_forward as the experts implementation "epkit" in transformers'
    ExpertsInterface (bf16/fp16/fp32 experts) and FP8ExpertsInterface (FP8 checkpoints).
    Idempotent; importing epkit.transformers calls it."""
    for iface in _interfaces():
        if iface._global_mapping.get(IMPLEMENTATION) is not experts_forward:
            iface.register(IMPLEMENTATION, experts_forward)


def registered() -> bool:
    """Whether "epkit" maps to this module's forward in every experts interface transformers has."""
    return all(iface._global_mapping.get(IMPLEMENTATION) is experts_forward for iface in _interfaces())


# -- the whole block: config mapping ------------------------------------------------------------

# transformers model_type -> MoE block class name (module transformers.models.<type>.modeling_<type>).
SUPPORTED_BLOCKS = {"deepseek_v3": "DeepseekV3MoE", "qwen3_moe": "Qwen3MoeSparseMoeBlock",
                    "mixtral": "MixtralSparseMoeBlock"}


def _cfg_unsupported(cfg, what: str) -> UnsupportedError:
    return UnsupportedError(f"epkit.MoELayer cannot run {type(cfg).__name__} (model_type "
                            f"{getattr(cfg, 'model_type', '?')!r}): {what}")


def layer_config_from(hf_config, *, max_tokens: int = 256, **overrides) -> Dict[str, Any]:
    """The epkit.MoELayerConfig fields (a dict; epkit.MoELayerConfig(**d)) of one MoE block of a
    transformers config at world size 1: DeepseekV3Config (grouped top-k over sigmoid scores with
    e_score_correction_bias, routed_scaling_factor, one shared expert of moe_intermediate_size *
    n_shared_experts), Qwen3MoeConfig (softmax top-k, renormalised iff norm_topk_prob) and
    MixtralConfig (softmax top-k, renormalised). max_tokens: the most tokens one layer call takes
    (larger inputs are split); overrides: any other MoELayerConfig field (schedule, ...).
    Raises UnsupportedError for what epkit's layer does not compute. Pure: needs no GPU and no
    compiled extension."""
    cfg = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED_BLOCKS:
        raise _cfg_unsupported(cfg, f"patch_moe maps only {sorted(SUPPORTED_BLOCKS)} configs onto epkit.MoELayer")
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        raise _cfg_unsupported(cfg, f"hidden_act={act!r}; epkit's experts compute SiLU(gate) * up")
    if getattr(cfg, "output_router_logits", False):
        raise _cfg_unsupported(cfg, "output_router_logits=True; the fused layer keeps its router logits inside "
                                    "(use the experts implementation instead)")
    d: Dict[str, Any] = dict(hidden=int(cfg.hidden_size), topk=int(cfg.num_experts_per_tok), world_size=1, rank=0,
                             dp_size=1, max_tokens_per_rank=int(max_tokens), schedule="none", layout="packed",
                             num_groups=1, topk_groups=1, renormalize=True, routed_scaling=1.0,
                             num_shared_experts=0, shared_intermediate=0)
    if mt == "deepseek_v3":
        if not getattr(cfg, "norm_topk_prob", True):
            raise _cfg_unsupported(cfg, "norm_topk_prob=False; epkit's grouped top-k router always normalises the "
                                        "top-k weights (then scales them by routed_scaling_factor)")
        if cfg.n_group is None or cfg.topk_group is None:
            raise _cfg_unsupported(cfg, "n_group / topk_group unset; epkit's grouped router needs both")
        d.update(intermediate=int(cfg.moe_intermediate_size), num_experts=int(cfg.n_routed_experts),
                 router_mode="grouped_topk", num_groups=int(cfg.n_group), topk_groups=int(cfg.topk_group),
                 routed_scaling=float(cfg.routed_scaling_factor))
        n_shared = int(getattr(cfg, "n_shared_experts", 0) or 0)
        if n_shared > 0:  # several shared experts are one expert n times wider
            d.update(num_shared_experts=1, shared_intermediate=int(cfg.moe_intermediate_size) * n_shared)
    elif mt == "qwen3_moe":
        d.update(intermediate=int(cfg.moe_intermediate_size), num_experts=int(cfg.num_experts),
                 router_mode="softmax_topk", renormalize=bool(cfg.norm_topk_prob))
    else:  # mixtral
        d.update(intermediate=int(cfg.intermediate_size), num_experts=int(cfg.num_local_experts),
                 router_mode="softmax_topk", renormalize=True)
    d.update(overrides)
    _check_layer_fields(cfg, d)
    return d


def _check_layer_fields(cfg, d: Dict[str, Any]) -> None:
    """epkit's limits, named by the transformers field that breaks them (the C++ validate() checks
    them again when the layer is made)."""
    if d["hidden"] % SCALE_BLOCK:
        raise _cfg_unsupported(cfg, f"hidden_size={d['hidden']} is not a multiple of {SCALE_BLOCK}")
    inter_name = "intermediate_size" if cfg.model_type == "mixtral" else "moe_intermediate_size"
    if d["intermediate"] % SCALE_BLOCK:
        raise _cfg_unsupported(cfg, f"{inter_name}={d['intermediate']} is not a multiple of {SCALE_BLOCK}")
    if d["shared_intermediate"] % SCALE_BLOCK:
        raise _cfg_unsupported(cfg, f"the shared expert's intermediate size {d['shared_intermediate']} is not a "
                                    f"multiple of {SCALE_BLOCK}")
    if not 1 <= d["num_experts"] <= 512:
        raise _cfg_unsupported(cfg, f"{d['num_experts']} routed experts; epkit's router takes 1..512")
    if not 1 <= d["topk"] <= min(16, d["num_experts"]):
        raise _cfg_unsupported(cfg, f"num_experts_per_tok={d['topk']}; epkit's router takes 1..16 (<= experts)")
    if d["router_mode"] == "grouped_topk":
        g, tg = d["num_groups"], d["topk_groups"]
        if g < 1 or d["num_experts"] % g:
            raise _cfg_unsupported(cfg, f"n_group={g} does not divide n_routed_experts={d['num_experts']}")
        if not 1 <= tg <= g:
            raise _cfg_unsupported(cfg, f"topk_group={tg} is not in 1..n_group={g}")
        if d["topk"] > tg * (d["num_experts"] // g):
            raise _cfg_unsupported(cfg, f"num_experts_per_tok={d['topk']} exceeds the experts of the kept groups "
                                        f"({tg} x {d['num_experts'] // g})")
    if d["max_tokens_per_rank"] < 1:
        raise ValueError(f"max_tokens={d['max_tokens_per_rank']} must be >= 1")


# -- the whole block: weights and the replacement module ----------------------------------------

def _block_classes() -> Dict[str, type]:
    import importlib
    out = {}
    for mt, cls_name in SUPPORTED_BLOCKS.items():
        try:
            mod = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
        except Exception:  # noqa: BLE001 - a transformers without this model
            continue
        cls = getattr(mod, cls_name, None)
        if cls is not None:
            out[mt] = cls
    return out


def _family_of(block) -> Optional[str]:
    for mt, cls in _block_classes().items():
        if isinstance(block, cls):
            return mt
    return None


def _linear_fp8(block, lin, what: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight [N, K], fp32 128x128 scale_inv) of an nn.Linear (quantized here) or a
    transformers FP8Linear (its checkpoint tensors as they are)."""
    w = lin.weight
    if w.dtype == FP8:
        block_size = getattr(lin, "block_size", None)
        s = getattr(lin, "weight_scale_inv", None)
        nb = lambda n: (n + SCALE_BLOCK - 1) // SCALE_BLOCK  # noqa: E731
        if block_size is None or tuple(int(b) for b in block_size) != (SCALE_BLOCK, SCALE_BLOCK) or s is None \
                or tuple(s.shape) != (nb(w.shape[0]), nb(w.shape[1])):
            raise _unsupported(block, f"{what} is FP8 without 128x128 weight_scale_inv tiles")
        return w.detach().contiguous(), s.detach().float().contiguous()
    q = _ops().quantize_weights(w.detach().to(torch.bfloat16).contiguous())
    return q.q, q.scale_inv


def _block_parts(block, family: str):
    """(config, router, experts, shared MLP or None) of a supported block, checked against epkit."""
    experts = block.experts
    cfg = getattr(block, "config", None) or getattr(experts, "config", None)
    if cfg is None:
        raise _unsupported(block, "no config on the block or its experts")
    router = block.gate
    shared = getattr(block, "shared_experts", None) if family == "deepseek_v3" else None
    return cfg, router, experts, shared


def _check_block(block: torch.nn.Module, max_tokens: int, overrides: Dict[str, Any]):
    """(family, router, experts, shared MLP or None, MoELayerConfig fields) of a block patch_moe can
    convert; raises UnsupportedError naming what it cannot. Runs no kernel."""
    family = _family_of(block)
    if family is None:
        raise _unsupported(block, f"patch_moe converts only {sorted(SUPPORTED_BLOCKS.values())}")
    if block.training:
        raise _unsupported(block, "training mode; patch_moe is for inference: call model.eval() first")
    cfg, router, experts, shared = _block_parts(block, family)
    fields = layer_config_from(cfg, max_tokens=max_tokens, **overrides)
    spec = check_experts(experts)
    E, K = fields["num_experts"], fields["topk"]
    # The instance is what runs: its shapes and router settings must be the config's.
    if (spec.num_experts, spec.hidden, spec.intermediate) != (E, fields["hidden"], fields["intermediate"]):
        raise _unsupported(block, f"experts of shape E={spec.num_experts}, H={spec.hidden}, I={spec.intermediate} "
                                  f"but the config says E={E}, H={fields['hidden']}, I={fields['intermediate']}")
    if int(router.top_k) != K or int(router.num_experts) != E:
        raise _unsupported(block, f"router top_k={router.top_k}, num_experts={router.num_experts} differ from the "
                                  f"config's {K}, {E}")
    if family == "deepseek_v3":
        if (int(router.num_group), int(router.topk_group)) != (fields["num_groups"], fields["topk_groups"]) or \
                float(router.routed_scaling_factor) != fields["routed_scaling"] or not router.norm_topk_prob:
            raise _unsupported(block, "its router's n_group / topk_group / routed_scaling_factor / norm_topk_prob "
                                      "differ from the config's")
        if (shared is None) != (fields["num_shared_experts"] == 0):
            raise _unsupported(block, "shared experts present or absent against the config's n_shared_experts")
        if shared is not None:
            if not _is_silu(shared.act_fn):
                raise _unsupported(block, f"a shared expert with activation {type(shared.act_fn).__name__}")
            if int(shared.intermediate_size) != fields["shared_intermediate"]:
                raise _unsupported(block, f"shared expert intermediate {shared.intermediate_size} but the config "
                                          f"gives {fields['shared_intermediate']}")
            for what in ("gate_proj", "up_proj", "down_proj"):
                if getattr(getattr(shared, what), "bias", None) is not None:
                    raise _unsupported(block, f"shared_experts.{what} has a bias; epkit's shared expert takes none")
    elif family == "qwen3_moe":
        if bool(router.norm_topk_prob) != fields["renormalize"]:
            raise _unsupported(block, "its router's norm_topk_prob differs from the config's")
    if not isinstance(router.weight, torch.Tensor) or tuple(router.weight.shape) != (E, fields["hidden"]):
        raise _unsupported(block, f"router weight of shape {tuple(router.weight.shape)}, not [{E}, {fields['hidden']}]")
    dev = router.weight.device
    if dev.type != "cuda" or experts.gate_up_proj.device != dev:
        raise _unsupported(block, f"weights on {dev} / {experts.gate_up_proj.device}; epkit.MoELayer runs on one "
                                  "CUDA device")
    return family, router, experts, shared, fields


def convert_block(block: torch.nn.Module, *, max_tokens: int = 256, name: Optional[str] = None,
                  **overrides) -> "EpkitMoEBlock":
    """An EpkitMoEBlock (one epkit.MoELayer at world size 1) computing `block`, a DeepseekV3MoE,
    Qwen3MoeSparseMoeBlock or MixtralSparseMoeBlock, from its weights. The experts' FP8 weights
    are the experts implementation's cache when it exists (shared, not copied), else made now.
    Raises UnsupportedError before allocating anything the block cannot be."""
    if name:
        _names[block] = name
    family, router, experts, shared, fields = _check_block(block, max_tokens, overrides)
    from .moe_layer import MoELayer, MoELayerConfig  # epkit._C: the compiled extension
    with torch.no_grad():
        w = _cached(experts)
        weights: Dict[str, Optional[torch.Tensor]] = dict(w13=w.w13, w13_scale=w.w13_scale, w2=w.w2,
                                                          w2_scale=w.w2_scale)
        if shared is not None:
            g, gs = _linear_fp8(block, shared.gate_proj, "shared_experts.gate_proj")
            u, us = _linear_fp8(block, shared.up_proj, "shared_experts.up_proj")
            dq, ds = _linear_fp8(block, shared.down_proj, "shared_experts.down_proj")
            weights.update(shared_w13=torch.cat([g, u]), shared_w13_scale=torch.cat([gs, us]), shared_w2=dq,
                           shared_w2_scale=ds)
        weights["gate"] = router.weight.detach().to(torch.bfloat16).contiguous()
        if family == "deepseek_v3":
            weights["gate_bias"] = router.e_score_correction_bias.detach().float().contiguous()
    layer = MoELayer(MoELayerConfig(**fields), **weights)
    return EpkitMoEBlock(layer, fields, family, _describe(block))


class EpkitMoEBlock(torch.nn.Module):
    """A transformers MoE block computed by one epkit.MoELayer (world size 1): forward(hidden_states
    [..., H]) -> [..., H], the routed experts plus the shared expert, in FP8.

    The layer holds views of its FP8 weights (kept here, not as buffers: moving this module with
    .to() would leave the layer pointing at the old memory). Inputs of more than max_tokens tokens
    are split into chunks of max_tokens. forward(..., num_tokens=<1-element int32 device tensor>)
    computes only the first m rows (the rest of the output is left as it is): one CUDA graph
    captured with it serves every m up to the rows of the input.
    """

    def __init__(self, layer, fields: Dict[str, Any], family: str, source: str):
        super().__init__()
        self.layer = layer
        self.fields = dict(fields)
        self.family = family
        self.source = source
        self.hidden = int(fields["hidden"])
        self.max_tokens = int(fields["max_tokens_per_rank"])

    def extra_repr(self) -> str:
        f = self.fields
        return (f"{self.source} -> epkit.MoELayer(E={f['num_experts']}, K={f['topk']}, H={f['hidden']}, "
                f"I={f['intermediate']}, router={f['router_mode']}, shared={f['num_shared_experts']}, "
                f"max_tokens={self.max_tokens})")

    def forward(self, hidden_states: torch.Tensor, num_tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, self.hidden)
        if x.dtype != torch.bfloat16:
            x = x.to(torch.bfloat16)
        x = x.contiguous()
        T = x.shape[0]
        if T <= self.max_tokens:
            out = self.layer.forward(x, num_tokens=num_tokens)
        else:
            if num_tokens is not None:
                raise ValueError(f"EpkitMoEBlock: num_tokens with {T} rows, more than max_tokens={self.max_tokens}")
            out = torch.cat([self.layer.forward(x[i:i + self.max_tokens]) for i in range(0, T, self.max_tokens)])
        return out.view(shape).to(hidden_states.dtype)

    def destroy(self) -> None:
        """Frees the layer's device memory now (else when it is garbage collected)."""
        self.layer.destroy()


def _looks_like_moe_block(m: torch.nn.Module) -> bool:
    """A module whose child `experts` holds fused expert tensors (whatever its router is called)."""
    ex = getattr(m, "experts", None)
    return isinstance(ex, torch.nn.Module) and any(
        isinstance(getattr(ex, n, None), torch.Tensor) for n in ("gate_up_proj", "up_proj", "down_proj"))


def patch_moe(model: torch.nn.Module, *, max_tokens: int = 256, skip_unsupported: bool = False,
              **overrides) -> List[str]:
    """Replaces every supported MoE block under model (DeepseekV3MoE, Qwen3MoeSparseMoeBlock,
    MixtralSparseMoeBlock) by an EpkitMoEBlock: router, routed experts and shared expert as one
    epkit.MoELayer at world size 1 (no NVSHMEM bootstrap). max_tokens bounds the tokens of one layer
    call (its activation memory; longer inputs are split); overrides are MoELayerConfig fields.

    Every block is checked before any is replaced: a MoE block of another class, or one whose
    semantics epkit's layer lacks, raises UnsupportedError naming it (skip_unsupported=True leaves
    those blocks as they are). For inference: the model must be in eval mode; the replaced blocks'
    parameters leave the model (and its state_dict). Returns the names of the replaced blocks."""
    _name_modules(model)
    found, problems = [], []
    for name, m in model.named_modules():
        if not name or not _looks_like_moe_block(m):
            continue
        try:
            _check_block(m, max_tokens, overrides)
            found.append((name, m))
        except UnsupportedError as e:
            if not skip_unsupported:
                problems.append(str(e))
    if problems:
        raise UnsupportedError("; ".join(problems))
    done = []
    for name, m in found:
        new = convert_block(m, max_tokens=max_tokens, name=name, **overrides)
        model.set_submodule(name, new)
        done.append(name)
    return done


register()
