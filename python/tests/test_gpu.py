"""GPU suite: each test spawns W ranks (torch.multiprocessing, rank r on GPU r % device_count)."""

import pytest

pytest.importorskip("torch", reason="epkit's Python tests need torch")

from _harness import run_ranks  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("dp_size", [1, 2])
def test_dispatch_combine_pplx_api(world_size, dp_size):
    """bf16, fp16 and fp8 payloads; host m and bound_m; fused and split send/recv; buffer reuse."""
    from _cases import compat_correctness
    run_ranks(compat_correctness, world_size, dp_size, ["bf16", "fp16", "fp8"])


@pytest.mark.parametrize("world_size,dp_size", [(2, 1), (4, 2)])
def test_cuda_graph_capture(world_size, dp_size):
    from _cases import cuda_graph
    run_ranks(cuda_graph, world_size, dp_size, ["bf16", "fp8"])


@pytest.mark.parametrize("world_size,dp_size", [(2, 1), (4, 2)])
def test_weights_at_dispatch(world_size, dp_size):
    from _cases import weights_at_dispatch
    run_ranks(weights_at_dispatch, world_size, dp_size)


def test_idiomatic_api():
    from _cases import idiomatic
    run_ranks(idiomatic, 2)


def test_errors_raise_epkit_error():
    from _cases import errors
    run_ranks(errors, 2)


def test_nvshmem_helpers():
    from _cases import nvshmem_helpers
    run_ranks(nvshmem_helpers, 2)


def test_intranode_bootstraps_nvshmem_from_torch_distributed():
    from _cases import intranode_bootstrap
    run_ranks(intranode_bootstrap, 2, init_nvshmem=False)
