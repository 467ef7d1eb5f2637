"""Host-only checks: need torch and an importable epkit, no GPU and no NVSHMEM."""

import dataclasses

import pytest

pytest.importorskip("torch", reason="epkit's Python tests need torch")
epkit = pytest.importorskip("epkit", reason="epkit is not installed: pip install --no-build-isolation --no-deps .",
                            exc_type=ImportError)
import torch  # noqa: E402


def test_epkit_error_is_runtime_error():
    assert issubclass(epkit.EpkitError, RuntimeError)


def test_calls_before_init_raise_instead_of_crashing():
    assert not epkit.nvshmem_initialized()
    for fn in (epkit.nvshmem_my_pe, epkit.nvshmem_n_pes, epkit.nvshmem_barrier_all, lambda: epkit.nvshmem_maps_peer(0)):
        with pytest.raises(epkit.EpkitError, match="nvshmem_init"):
            fn()
    with pytest.raises(epkit.EpkitError, match="pe must be an int"):
        epkit.nvshmem_maps_peer(0.0)
    with pytest.raises(epkit.EpkitError, match="nvshmem_init"):
        epkit.pplx.AllToAll.internode(16, 8, 2, 0, 2, 1, 256, 512, 0)
    epkit.nvshmem_finalize()  # a no-op without init


def test_unique_id_tensors():
    uid = epkit.nvshmem_get_unique_id()
    assert uid.dtype == torch.uint8 and uid.shape == (epkit.nvshmem_unique_id_size(),) == (128,)
    empty = epkit.nvshmem_alloc_empty_unique_id()
    assert empty.dtype == torch.uint8 and empty.shape == (128,) and not empty.any()
    with pytest.raises(epkit.EpkitError, match="uint8"):
        epkit.nvshmem_init(torch.zeros(5, dtype=torch.uint8), 0, 1)


def test_config_fields_are_the_cpp_fields():
    cpp = {n for n in dir(epkit._C.AllToAllConfig()) if not n.startswith("_")}
    py = {f.name for f in dataclasses.fields(epkit.AllToAllConfig)}
    assert py <= cpp, f"fields missing in the C++ config: {py - cpp}"
    cpp_fields = {n for n in cpp if not callable(getattr(epkit._C.AllToAllConfig(), n))}
    assert cpp_fields <= py, f"C++ config fields missing in Python: {cpp_fields - py}"
    cfg = epkit.AllToAllConfig(num_experts=16, topk=4, hidden=7168, max_tokens_per_rank=128,
                               world_size=8, rank=3, dp_size=2, dispatch_dtype="fp8_e4m3", path="portable",
                               weights_at_dispatch=True, expert_scales_mn_major=True)
    c = cfg.to_cpp()
    for name in py - {"dispatch_dtype", "combine_in_dtype", "combine_out_dtype", "path", "layout"}:
        assert getattr(c, name) == getattr(cfg, name), name
    assert c.dispatch_dtype == epkit.DType.fp8_e4m3 and c.combine_out_dtype == epkit.DType.bf16
    assert c.path == epkit.DataPath.portable
    assert dataclasses.replace(cfg, path=epkit.DataPath.auto).to_cpp().path == epkit.DataPath.auto
    with pytest.raises(epkit.EpkitError, match="path"):
        dataclasses.replace(cfg, path="nvlink").to_cpp()
    with pytest.raises(epkit.EpkitError, match="dtype"):
        dataclasses.replace(cfg, dispatch_dtype="int3").to_cpp()


@pytest.mark.parametrize("hidden_dim_bytes,scale_bytes,needle", [
    (3 * 256, 0, "1 byte"),
    (256, 4, "per-token"),
    (512, 8, "no scales"),
    (100, 0, "below"),
])
def test_pplx_constructor_rejects_unsupported_layouts(hidden_dim_bytes, scale_bytes, needle):
    with pytest.raises(epkit.EpkitError, match=needle):
        epkit.pplx.AllToAll(max_num_tokens=16, num_experts=8, experts_per_token=2, rank=0, world_size=2, dp_size=1,
                       hidden_dim=256, hidden_dim_bytes=hidden_dim_bytes, hidden_dim_scale_bytes=scale_bytes)


def test_pplx_constructor_creates_the_object_at_once():
    """Nothing is left for the first call to create (so any dtype may first appear in a CUDA graph
    capture): even a 16-bit AllToAll needs NVSHMEM in its constructor."""
    with pytest.raises(epkit.EpkitError, match="nvshmem_init"):
        epkit.pplx.AllToAll(max_num_tokens=16, num_experts=8, experts_per_token=2, rank=0, world_size=2, dp_size=1,
                       hidden_dim=256, hidden_dim_bytes=512, hidden_dim_scale_bytes=0)
    with pytest.raises(epkit.EpkitError, match="1-byte elements but hidden_dim_bytes / hidden_dim = 2"):
        epkit.pplx.AllToAll(max_num_tokens=16, num_experts=8, experts_per_token=2, rank=0, world_size=2, dp_size=1,
                       hidden_dim=256, hidden_dim_bytes=512, hidden_dim_scale_bytes=0,
                       dispatch_dtype=torch.float8_e4m3fn)


def test_custom_ops_for_torch_compile_are_registered():
    """torch.compile traces dispatch/combine whole through these (see epkit/_ops.py)."""
    assert epkit._ops.UNAVAILABLE == "", epkit._ops.UNAVAILABLE
    assert str(epkit._ops.dispatch) == "epkit.dispatch.default" and str(epkit._ops.combine) == "epkit.combine.default"
    import re

    def mutated(op):
        return set(re.findall(r"Tensor\(a\d*!\)\??\s+(\w+)", str(op._schema)))

    # The outputs are declared written (that orders the calls in a compiled graph); the inputs are not.
    assert mutated(torch.ops.epkit.dispatch.default) == {"expert_x", "expert_x_scale", "expert_num_tokens",
                                                         "expert_offsets"}
    assert mutated(torch.ops.epkit.combine.default) == {"out"}
    assert not epkit._ops.compiling()  # eager here: calls go straight to the extension


def test_tensor_args():
    from epkit._tensors import arg
    assert arg(None, "x") is None
    with pytest.raises(epkit.EpkitError, match="x must be on a CUDA device"):
        arg(torch.zeros(2, 2), "x")


def test_nvshmem_halves_of_this_build_match():
    """The host library this process loaded can run the device half linked into libepkit_comm.so."""
    device, host, path, problem = epkit._C.nvshmem_versions()
    assert problem == "" and host[0] == device[0] and host[1] >= device[1], (device, host, path, problem)
    assert epkit._lib.NVSHMEM_VERSIONS[3] == ""


def test_mismatched_nvshmem_host_library_is_refused_before_init():
    """A host library of an older NVSHMEM minor (the build's stand-in for its version query, preloaded)
    is reported at import (RuntimeWarning) and refused with EpkitError by the first NVSHMEM call,
    naming both versions, before NVSHMEM is touched: no crash, no exit."""
    import os
    import subprocess
    import sys
    shim = os.path.join(os.path.dirname(epkit.__file__), "..", "..", "tests", "build", "libnvshmem_host_shim.so")
    if not os.path.exists(shim):
        pytest.skip("the build tree's tests/build/libnvshmem_host_shim.so is not here (installed epkit)")
    code = ("import warnings, epkit\n"
            "try:\n    epkit.nvshmem_get_unique_id()\n    print('NOT RAISED')\n"
            "except epkit.EpkitError as e:\n    print('RAISED:', e)\n")
    env = dict(os.environ, LD_PRELOAD=os.path.abspath(shim), EPKIT_SHIM_NVSHMEM_VERSION="3.1.7")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "RuntimeWarning: NVSHMEM version mismatch" in r.stderr, r.stderr[-2000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith(("RAISED", "NOT RAISED"))]
    assert line and line[0].startswith("RAISED:"), r.stdout
    device = ".".join(map(str, epkit._C.nvshmem_versions()[0]))
    assert "NVSHMEM version mismatch" in line[0] and "3.1.7" in line[0] and device in line[0], line[0]
