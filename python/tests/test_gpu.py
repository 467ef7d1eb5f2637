"""GPU suite: each test spawns W ranks (torch.multiprocessing, rank r on GPU r % device_count), so
one GPU runs them all as several PEs on it. `make test` runs the tests not marked stress (one spawn
costs several seconds of start-up per test); `make stress` runs the stress ones, the other world
size / dp combinations of the same bodies."""

import pytest

pytest.importorskip("torch", reason="epkit's Python tests need torch")

from _harness import run_ranks  # noqa: E402

pytestmark = pytest.mark.gpu
stress = pytest.mark.stress
# Four-rank runs share one pytest-xdist worker (--dist loadgroup), so that with three tests at a
# time no more than 4 + 2 + 2 PEs share the GPU (scripts/run-python-tests.sh).
four_pes = pytest.mark.xdist_group("four_pes")


@pytest.mark.parametrize("world_size,dp_size", [(2, 1), pytest.param(4, 2, marks=four_pes),
                                                pytest.param(2, 2, marks=stress),
                                                pytest.param(4, 1, marks=[stress, four_pes])])
def test_dispatch_combine_pplx_api(world_size, dp_size):
    """Every dtype set pplx-kernels accepts (dp_x bf16/fp16/fp8, expert_y and out_tokens bf16/fp16
    each), one pplx-style AllToAll per element size; host and device m, fused and split, buffer reuse."""
    from _cases import compat_correctness
    run_ranks(compat_correctness, world_size, dp_size)


@pytest.mark.parametrize("world_size,dp_size", [pytest.param(4, 2, marks=four_pes), pytest.param(2, 1, marks=stress)])
def test_cuda_graph_capture(world_size, dp_size):
    """A dtype set the AllToAll never saw, first used inside the capture; replays with new m."""
    from _cases import cuda_graph
    run_ranks(cuda_graph, world_size, dp_size)


@pytest.mark.parametrize("world_size,dp_size", [(2, 1)])
def test_torch_compile(world_size, dp_size):
    """torch.compile(ata.dispatch) and torch.compile(ata.combine): the graph-break fallback, then the
    custom ops with fullgraph=True."""
    from _cases import torch_compile
    run_ranks(torch_compile, world_size, dp_size)


@pytest.mark.parametrize("world_size,dp_size", [pytest.param(4, 2, marks=four_pes), pytest.param(2, 1, marks=stress)])
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
    """nvshmem_alltoall works, or raises EpkitError where PEs share a GPU without MPS."""
    from _cases import nvshmem_helpers
    run_ranks(nvshmem_helpers, 2)


def test_intranode_bootstraps_nvshmem_from_torch_distributed():
    from _cases import intranode_bootstrap
    run_ranks(intranode_bootstrap, 2, init_nvshmem=False)


def test_world_size_1_without_nvshmem():
    """The native API at world size 1 in a process that never calls nvshmem_init."""
    from _cases import world_size_1_without_nvshmem
    run_ranks(world_size_1_without_nvshmem, 1, init_nvshmem=False)
