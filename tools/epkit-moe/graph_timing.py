"""epkit-moe's timing method for the Python baselines (torch_baselines.py, deepgemm_baseline.py,
transformers_bench.py), the same as the C++ tool's time_graph (gpu_util.hpp):

N back-to-back calls captured in one CUDA graph (warmed up outside the capture first), replayed R
times with the L2 flushed (untimed) before every replay; CUDA events around each replay, divided by
N. Several systems are timed together with their replays alternating (order reversed every other
round), so that drift hits them alike. torch is imported by the caller; nothing here runs at import.
"""
import math
import statistics


def pick_repeats(est_us):
    """(calls per graph, replays) for a call estimated at est_us: about 0.2 s of replays in all."""
    calls = 20 if est_us < 1000 else 5 if est_us < 10000 else 2
    replays = int(min(50, max(5, 200000.0 / max(est_us * calls, 1.0))))
    return calls, replays


def rotation_sets(bytes_per_call, l2, calls):
    """Input sets to rotate over so that together they exceed 4x the L2 (at most one per call)."""
    if bytes_per_call <= 0:
        return 1
    return int(min(max(1, math.ceil(4 * l2 / bytes_per_call) + 1), calls))


class Flush:
    """Writes a buffer of 4x the L2 (at least 256 MiB): what a replay reads is not left in the L2."""

    def __init__(self, torch, l2):
        self.buf = torch.empty(max(4 * l2, 256 << 20), dtype=torch.uint8, device="cuda")

    def run(self):
        self.buf.fill_(0x5A)


def p99(samples):
    """Nearest-rank 99th percentile."""
    s = sorted(samples)
    return s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]


def time_graphs(torch, flush, calls, replays, fns, warmup=3):
    """One graph of `calls` calls fn(0) .. fn(calls - 1) per fn; returns each fn's per-call µs, one
    sample per replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture (lazy init, JIT loading, autotuning)
        for fn in fns:
            for i in range(min(calls, warmup)):
                fn(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graphs = []
    for fn in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(calls):
                fn(i)
        graphs.append(g)
    for _ in range(2):
        for g in graphs:
            g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    us = [[] for _ in fns]
    for r in range(replays):
        for i in (range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))):
            flush.run()
            a.record()
            graphs[i].replay()
            b.record()
            b.synchronize()
            us[i].append(1000.0 * a.elapsed_time(b) / calls)
    del graphs
    return us


def finish(row, ceil):
    """Adds GB/s, weight GB/s, TFLOP/s and the % of the same run's ceiling (HBM read on the weight
    bytes where the row has them, else on all bytes; FP8 dense) that bounds the row."""
    s = row["us_median"] * 1e-6
    row["GBps"] = row["bytes"] / s / 1e9
    row["weight_GBps"] = row["weight_bytes"] / s / 1e9
    row["TFLOPs"] = row["flops"] / s / 1e12
    hbm, fp8 = ceil.get("hbm_read_GBps"), ceil.get("fp8_dense_TFLOPs")
    bw = (row["weight_GBps"] if row["weight_bytes"] > 0 else row["GBps"]) / hbm if hbm else 0.0
    fl = row["TFLOPs"] / fp8 if fp8 else 0.0
    row["bound"] = "fp8" if fl > bw else "hbm"
    row["pct_of_ceiling"] = 100.0 * max(bw, fl)
    return row
