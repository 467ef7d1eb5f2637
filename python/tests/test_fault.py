"""A peer that stops mid-dispatch or mid-combine, through each Python API (marker fault; bodies in
_fault_cases.py): the native epkit.AllToAll, epkit.pplx.AllToAll, epkit.deep_ep.Buffer and
epkit.MoELayer, two ranks on the GPU(s).

Each surviving rank must report EpkitError naming "timed out", the phase it waited in and the victim,
within the device timeout (EPKIT_FAULT_TIMEOUT_MS, default 3000) + 5 s; its next call must raise at
once (< 1 s) without launching (the layer leaves its output untouched); nvshmem_finalize must return
within 5 s; and every process must end: nothing hangs. The ranks are this test's own processes (not
torch's spawn-and-join, which would stop the survivor as soon as the victim dies), so that a killed
victim leaves the survivor to report.

`make test` runs one scenario per API, alternating the phase; `make stress` the other twelve.
"""

import json
import os
import socket
import tempfile
import time

import pytest

torch = pytest.importorskip("torch", reason="epkit's Python tests need torch")

pytestmark = [pytest.mark.gpu, pytest.mark.fault]
stress = pytest.mark.stress
TIMEOUT_MS = int(os.environ.get("EPKIT_FAULT_TIMEOUT_MS", 3000))
MODES = ("kill", "skip-dispatch", "skip", "kill-combine")
# make test: one scenario per API, the phases alternating; make stress: the other twelve.
SHORT = {("native", "kill"), ("pplx", "skip"), ("deep_ep", "skip-dispatch"), ("layer", "kill-combine")}
CASES = [pytest.param(api, mode, marks=[] if (api, mode) in SHORT else [stress], id=f"{api}-{mode}")
         for api in ("native", "pplx", "deep_ep", "layer") for mode in MODES]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_fault(api: str, mode: str, world_size: int = 2, limit_s: float = 180.0):
    """Starts the ranks, waits for the survivors to report and exit, then ends the victim; returns
    (results per survivor rank, seconds until the last survivor exited)."""
    import torch.multiprocessing as mp
    import _fault_cases as FC
    ctx = mp.get_context("spawn")
    out_dir = tempfile.mkdtemp(prefix="epkit-fault-")
    port = _free_port()
    procs = [ctx.Process(target=FC.entry, args=(r, world_size, port, api, mode, TIMEOUT_MS, out_dir), daemon=True)
             for r in range(world_size)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    survivors = procs[:-1]
    try:
        for p in survivors:
            p.join(max(1.0, limit_s - (time.monotonic() - t0)))
        elapsed = time.monotonic() - t0
        hung = [r for r, p in enumerate(survivors) if p.is_alive()]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(10)
    left = [r for r, p in enumerate(procs) if p.is_alive()]
    assert not left, f"{api} {mode}: ranks {left} are still running after being killed"
    assert not hung, f"{api} {mode}: surviving ranks {hung} did not finish within {limit_s:.0f} s (a hang)"
    results = {}
    for r, p in enumerate(survivors):
        path = os.path.join(out_dir, f"rank{r}.json")
        assert os.path.exists(path), f"{api} {mode}: rank {r} exited with code {p.exitcode} without a report"
        with open(path) as f:
            results[r] = json.load(f)
    return results, elapsed


@pytest.mark.parametrize("api,mode", CASES)
def test_peer_stops(api, mode):
    import _fault_cases as FC
    results, elapsed = run_fault(api, mode)
    victim = len(results)
    phase = FC.expected_phase(mode)
    for r, res in results.items():
        tag = f"{api} {mode} rank {r}"
        assert "unexpected" not in res, f"{tag}: failed before the fault: {res['unexpected']}"
        err = res.get("error")
        assert err, f"{tag}: no error after the peer stopped ({res})"
        assert "timed out" in err, f"{tag}: not a timeout: {err}"
        assert f"from rank {victim}" in err, f"{tag}: the error does not name rank {victim}: {err}"
        assert f" in {phase}_" in err, f"{tag}: the error does not name the {phase} phase: {err}"
        assert res["ms"] <= TIMEOUT_MS + 5000, f"{tag}: the error took {res['ms']:.0f} ms (> timeout + 5 s)"
        reuse = res.get("reuse")
        assert reuse and reuse.startswith("EpkitError") and "unusable" in reuse, \
            f"{tag}: the next call did not refuse with EpkitError ('unusable'): {reuse}"
        assert res["reuse_ms"] < 1000, f"{tag}: the refused call took {res['reuse_ms']:.0f} ms"
        if api == "layer":
            assert not res["reuse_wrote_output"], f"{tag}: the refused forward wrote its output"
        assert res["finalize"] == "ok" and res["finalize_ms"] < 5000, \
            f"{tag}: nvshmem_finalize after the fault: {res['finalize']} in {res['finalize_ms']:.0f} ms"
        print(f"[fault] {tag}: EpkitError after {res['ms']:.0f} ms (timeout {TIMEOUT_MS} ms), next call refused "
              f"in {res['reuse_ms']:.0f} ms, finalize {res['finalize_ms']:.0f} ms; survivors done in {elapsed:.1f} s")
