"""The fuzzer of the Python surface (marker fuzz; _fuzz.py says what is drawn and what must hold).

Every call either computes the reference result or raises EpkitError naming the argument, writes
nothing outside its outputs (poisoned guard regions) and never ends the process. Short runs are in
`make test` (EPKIT_FUZZ_EXAMPLES per API, default 25; EPKIT_FUZZ_W2_CASES per world-size-2 API,
default 6), long runs in `make stress` (EPKIT_FUZZ_LONG_EXAMPLES, default 400; EPKIT_FUZZ_LONG_W2_CASES,
default 60). World size 1 runs in this process without NVSHMEM; pplx and deep_ep at world size 2 in
spawned ranks, each running the list of cases hypothesis drew here. Without a GPU: the CPU surface
(what raises before any launch: CPU tensors, configs) and the deep_ep bodies on the host model.

EPKIT_FUZZ_SEED replays a run (default: random, printed). Outcomes go to EPKIT_FUZZ_REPORT_DIR;
conftest.py merges them into fuzz-report.json and prints the table.
"""

import os
import random

import pytest

torch = pytest.importorskip("torch", reason="epkit's Python tests need torch")
hypothesis = pytest.importorskip("hypothesis", reason="the fuzzer needs hypothesis (pip install hypothesis)")
epkit = pytest.importorskip("epkit", reason="epkit is not installed: pip install --no-build-isolation --no-deps .",
                            exc_type=ImportError)

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as hyp_seed  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import _fuzz as F  # noqa: E402

pytestmark = pytest.mark.fuzz
gpu, stress = pytest.mark.gpu, pytest.mark.stress
SEED = int(os.environ.get("EPKIT_FUZZ_SEED") or random.SystemRandom().randrange(1 << 30))
SHORT = int(os.environ.get("EPKIT_FUZZ_EXAMPLES", 25))
LONG = int(os.environ.get("EPKIT_FUZZ_LONG_EXAMPLES", 400))
SHORT_W2 = int(os.environ.get("EPKIT_FUZZ_W2_CASES", 6))
LONG_W2 = int(os.environ.get("EPKIT_FUZZ_LONG_W2_CASES", 60))
SCALES = [pytest.param("short", id="short"), pytest.param("long", id="long", marks=stress)]


def _run(strategy, body, examples: int, name: str) -> None:
    """body(case) for `examples` hypothesis examples (shrinking a failure), then this test's outcomes
    into the report."""
    F.REPORT.counts.clear()

    @settings(max_examples=examples, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @hyp_seed(SEED)
    @given(strategy)
    def fuzz(case):
        body(case)

    print(f"[fuzz] {name}: {examples} examples, EPKIT_FUZZ_SEED={SEED}")
    try:
        fuzz()
    finally:
        F.REPORT.write(name, {"seed": SEED})


def _draw_list(strategy, n: int):
    """The n cases hypothesis generates here for `strategy` (its simplest first, then random ones), for
    spawned ranks, which must all run the same list."""
    box = []

    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @hyp_seed(SEED)
    @given(strategy)
    def draw(case):
        box.append(case)

    draw()
    return box


# -- without a GPU ---------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_cpu_surface(scale):
    """CPU tensors and random config values at every API: EpkitError naming an argument or field,
    nothing else (these checks run before any launch, so they hold on a machine without a GPU too)."""
    _run(F.cpu_strategy(st), F.fuzz_cpu, 4 * (SHORT if scale == "short" else LONG), f"cpu-{scale}")


@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_deep_ep_bodies_on_the_host_model(scale):
    """The deep_ep fuzz bodies, two ranks as threads over the host model of AllToAll (no GPU): checks
    deep_ep's own argument checks and mapping under random input, and the fuzz bodies themselves."""
    import _deep_ep_cases as D
    import _deep_ep_host_model as hm
    F.REPORT.counts.clear()
    cases = _draw_list(F.deep_ep_strategy(st), SHORT_W2 * 2 if scale == "short" else LONG_W2)

    def body(rank, W):
        F.deep_ep_fuzz_cases(D.HostEnv(), rank, W, cases)

    print(f"[fuzz] deep_ep host model: {len(cases)} cases, EPKIT_FUZZ_SEED={SEED}")
    hm.run_threads(2, body, seed=SEED)


# -- world size 1, in this process -----------------------------------------------------------------

@pytest.fixture(scope="module")
def record():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return epkit.ErrorRecord()


@gpu
@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_route(scale, record):
    _run(F.route_strategy(st), lambda c: F.fuzz_route(c, record), SHORT if scale == "short" else LONG, f"route-{scale}")


@gpu
@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_quantize(scale, record):
    _run(F.quant_strategy(st), lambda c: F.fuzz_quantize(c, record), SHORT if scale == "short" else LONG,
         f"quantize-{scale}")


@gpu
@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_grouped_gemm(scale, record):
    _run(F.gemm_strategy(st, epkit.available_gemm_configs()), lambda c: F.fuzz_grouped_gemm(c, record),
         SHORT if scale == "short" else LONG, f"grouped_gemm-{scale}")


@gpu
@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_silu_mul_quantize(scale, record):
    _run(F.silu_strategy(st), lambda c: F.fuzz_silu(c, record), SHORT if scale == "short" else LONG,
         f"silu_mul_quantize-{scale}")


@gpu
@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_moe_layer_forward(scale):
    """MoELayer at world size 1 in this process (no NVSHMEM): one layer per schedule and layout."""
    try:
        _run(F.layer_strategy(st), F.fuzz_layer, SHORT if scale == "short" else LONG, f"MoELayer-{scale}")
    finally:
        F.release_layers()


@gpu
@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_all_to_all_world_size_1(scale):
    """epkit.AllToAll (native) at world size 1 in this process (no NVSHMEM)."""
    try:
        _run(F.a2a_strategy(st), F.fuzz_all_to_all, SHORT if scale == "short" else LONG, f"AllToAll-{scale}")
    finally:
        F.release_all_to_all()


# -- the compatible APIs at world size 2, spawned ranks --------------------------------------------

@gpu
@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_pplx_world_size_2(scale):
    from _harness import run_ranks
    cases = _draw_list(F.pplx_strategy(st), SHORT_W2 if scale == "short" else LONG_W2)
    print(f"[fuzz] pplx W=2: {len(cases)} cases, EPKIT_FUZZ_SEED={SEED}")
    run_ranks(F.fuzz_pplx_ranks, 2, cases)


@gpu
@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_deep_ep_world_size_2(scale):
    from _harness import run_ranks
    cases = _draw_list(F.deep_ep_strategy(st), SHORT_W2 if scale == "short" else LONG_W2)
    print(f"[fuzz] deep_ep W=2: {len(cases)} cases, EPKIT_FUZZ_SEED={SEED}")
    run_ranks(F.fuzz_deep_ep_ranks, 2, cases)
