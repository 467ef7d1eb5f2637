"""epkit.deep_ep on the GPU, in the style of DeepEP's tests/test_low_latency.py and
tests/test_intranode.py: each test spawns W ranks (_harness.run_ranks: rank r on GPU r % device_count,
so one GPU runs them all as several PEs), dp 1, and runs a body of _deep_ep_cases.py, which states
what is exact and what has a tolerance. Inputs are fresh each run: EPKIT_PY_SEED (default: random)
seeds them and every failure names it.

`make test` runs the tests not marked stress (world size 2: four spawned runs); `make stress` runs the
rest: world sizes 1, 4 and 8, the portable path, packed UE8M0 normal-mode scales, the group-agreed
bound. The eight-PE runs must not share the GPU with other spawned tests (NVSHMEM fails to map its heap
beyond 8 PEs on one GPU): run them on their own, e.g.
    python3 -m pytest -p no:xdist -m "gpu and stress" -k "W8" python/tests/test_deep_ep.py
"""

import os
import random

import pytest

pytest.importorskip("torch", reason="epkit's Python tests need torch")

from _harness import run_ranks  # noqa: E402

pytestmark = pytest.mark.gpu
stress = pytest.mark.stress
four_pes = pytest.mark.xdist_group("four_pes")
eight_pes = pytest.mark.xdist_group("eight_pes")
SEED = int(os.environ.get("EPKIT_PY_SEED") or random.SystemRandom().randrange(1 << 30))


def _cases():
    import _deep_ep_cases
    return _deep_ep_cases


def _w(world_size, *marks):
    return pytest.param(world_size, marks=list(marks), id=f"W{world_size}")


@pytest.mark.parametrize("world_size", [_w(2), _w(1, stress), _w(4, stress, four_pes), _w(8, stress, eight_pes)])
def test_low_latency(world_size):
    """low_latency_dispatch/combine: bf16, fp8, round_scale, ue8m0; fused, hook, async; zero_copy, out=,
    cumulative stats; 1 / 7 / 24 tokens per rank with masked (-1) entries; two dispatches in flight;
    then one CUDA graph per (fp8, fused) and (bf16, hooks), replayed three times with new inputs."""
    run_ranks(_cases().gpu_low_latency, world_size, SEED)


@pytest.mark.parametrize("world_size", [_w(2, stress), _w(4, stress, four_pes)])
def test_low_latency_portable_path(world_size):
    """allow_nvlink_for_low_latency_mode=False: put-with-signal to every peer, what crosses nodes."""
    run_ranks(_cases().gpu_low_latency_portable, world_size, SEED)


@pytest.mark.parametrize("world_size", [_w(2, stress)])
def test_low_latency_hidden_640(world_size):
    """A hidden size DeepEP's low-latency kernels do not take (640: five scales, a partial UE8M0 word)."""
    run_ranks(_cases().gpu_low_latency, world_size, SEED,
              [(True, True, True, "hook"), (True, False, False, "fused"), (False, False, False, "async")], 640)


@pytest.mark.parametrize("world_size,payloads,pinned", [
    pytest.param(2, ("bf16", "fp8"), True, id="W2"),
    pytest.param(2, ("fp8_packed",), False, marks=stress, id="W2-ue8m0-agreed-bound"),
    pytest.param(1, ("bf16", "fp8"), True, marks=stress, id="W1"),
    pytest.param(4, ("bf16", "fp8", "fp8_packed"), False, marks=[stress, four_pes], id="W4"),
    pytest.param(8, ("bf16", "fp8"), True, marks=[stress, eight_pes], id="W8"),
])
def test_normal(world_size, payloads, pinned):
    """get_dispatch_layout; dispatch with and without top-k (exact rows in DeepEP's order, remapped
    top-k, aligned per-expert counts, handle), num_worst_tokens, cached dispatch; combine with and
    without topk_weights (bit-exact); sync and async with previous_event and allocate_on_comm_stream;
    then num_worst_tokens dispatch + combine in one CUDA graph, replayed three times."""
    run_ranks(_cases().gpu_normal, world_size, SEED, pinned, payloads)


@pytest.mark.parametrize("world_size", [_w(2), _w(4, stress, four_pes)])
def test_errors(world_size):
    """Bad input raises EpkitError naming the value and the limit, before any launch; the Buffer works after."""
    run_ranks(_cases().gpu_errors, world_size, SEED)


@pytest.mark.parametrize("world_size", [_w(2), _w(4, stress, four_pes), _w(8, stress, eight_pes)])
def test_sglang_low_latency(world_size):
    """SGLang's low-latency dispatcher end to end: Buffer sized by get_low_latency_rdma_size_hint (and
    bootstrapping NVSHMEM over torch.distributed), fp8 dispatch with a receive hook, epkit.grouped_gemm /
    silu_mul_quantize / grouped_gemm over the masked layout, weighted combine with a hook."""
    run_ranks(_cases().gpu_sglang, world_size, SEED, init_nvshmem=False)
