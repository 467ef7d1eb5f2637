// The CPU side of epkit-moe: options, the shape grids of the kernel and layer modes, result rows and their
// JSON. Tested on the CPU (tests/bench/test_moe_bench.cpp); the GPU parts fill the rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "epkit/plan/json.hpp"

namespace epkit::moebench {

// One measured (kernel or layer stage, system, shape) point. Times in microseconds, bytes and FLOP
// per call, rates in GB/s (1e9 B/s) and TFLOP/s.
struct Row {
  std::string kernel;   // "grouped_gemm", "router", "quantize", "silu_mul_quantize", ...
  std::string system;   // "epkit", "torch_scaled_grouped_mm", "torch_bmm_bf16", "torch", ...
  std::string variant;  // e.g. "up_gate" / "down", router mode, the GEMM config, "uneven"
  int G = 0, m = 0, N = 0, K = 0;  // groups, rows per group (tokens for router/quant), out dim, reduction dim
  double us_median = 0, us_p99 = 0;
  double bytes = 0;          // bytes the kernel must move (each input read once, output written once)
  double weight_bytes = 0;   // GEMM: weight (+ scale) bytes of the groups that have rows
  double flops = 0;
  double GBps = 0, weight_GBps = 0, TFLOPs = 0;
  double pct_of_ceiling = 0;  // 100 x max(GB/s / HBM read ceiling, TFLOP/s / FP8 ceiling); GEMM decode: on weight bytes
  std::string bound;          // which ceiling pct_of_ceiling is taken against: "hbm" or "fp8"
  int calls = 0, replays = 0; // the timing method's graph size and replay count
  std::string note;
};

// Fills GBps / weight_GBps / TFLOPs / pct_of_ceiling / bound from the times and the ceilings.
// For a GEMM row the bandwidth term is taken on weight bytes ("GB/s on weight bytes", docs/PERF.md),
// other rows on all the bytes they must move.
void finish_row(Row& r, double hbm_GBps, double fp8_TFLOPs);

struct Options {
  std::string mode = "kernels";         // "kernels" or "layer"
  std::vector<std::string> kernels = {"router", "gate_router", "quantize", "silu_mul_quantize", "grouped_gemm"};
  std::vector<int> groups = {2, 8, 16, 32, 64};
  std::vector<int> m = {1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096};
  std::vector<int> batches = {1, 4, 16, 32, 64, 128};  // layer mode: batch per rank
  std::vector<int> query_lens = {1, 2};                  // layer mode
  std::vector<int> experts = {256, 32};                  // layer mode: E on this GPU
  std::vector<std::string> schedules = {"none", "dispatch_overlap", "microbatch"};
  bool sweep_configs = false;  // grouped GEMM: time every compiled config, not only the heuristic's
  // router: route()'s kernels to time on the grouped router ("auto": its own choice; "general",
  // "warp_grouped": forced through RouterConfig::kernel), and rounds per point with the kernels
  // interleaved (a row holds the median of its rounds' medians, the note each round's).
  std::vector<std::string> router_kernels = {"auto"};
  int rounds = 1;
  bool quick = false;          // fewer points and smaller ceilings (smoke runs)
  std::string json;            // write results here
  std::string merge;           // an existing JSON whose rows (other systems) are kept
};
// Parses argv (without argv[0]); throws epkit::Error naming a bad option or value.
Options parse_options(const std::vector<std::string>& args);
std::string usage();

// The grouped GEMM's two DeepSeek-V3 expert shapes: up/gate (N 2I = 4096, K H = 7168) and down
// (N H = 7168, K I = 2048).
struct GemmShape {
  const char* name;
  int n, k;
};
inline constexpr GemmShape kDeepSeekUpGate{"up_gate", 4096, 7168};
inline constexpr GemmShape kDeepSeekDown{"down", 7168, 2048};

// One measured MoE layer: a schedule at one batch and query length.
struct LayerStep {
  std::string name;   // MoELayer::steps(): "gate", "router", "quantize", "dispatch", "combine", "gemm_w13", ...
  double us_median = 0;
};
struct LayerRow {
  std::string schedule;     // "none", "dispatch_overlap", "microbatch"
  std::string layout;       // dispatch's expert layout: "masked" / "packed"
  std::string shared = "in_stream";  // where the shared expert ran: "concurrent" (own branch) or "in_stream"
  std::string gate_router = "separate";  // "fused": one kernel (moe::GateRouter), "separate": cuBLASLt's gate, then route()
  int world_size = 1, experts = 0, batch = 0, query_len = 1, tokens = 0;  // tokens = batch * query_len
  double us_median = 0, us_p99 = 0;              // one forward, event-timed, launched from the host
  double graph_us_median = 0, graph_us_p99 = 0;  // forwards replayed from a CUDA graph (time_graph)
  double steps_us_sum = 0;        // sum of the standalone graph times of the layer's kernels
  double graph_over_steps = 0;    // graph_us_median / steps_us_sum (target <= 1.10)
  double weight_bytes_touched = 0;  // fp8 weights + scales of the experts with tokens, shared expert and gate
  double weight_bound_us = 0;       // weight_bytes_touched at the measured HBM read ceiling
  std::vector<LayerStep> steps;   // the breakdown (schedule none only)
  std::string note;
};
plan::Json layer_row_json(const LayerRow& r);

// Per-group rows of the uneven grouped-GEMM case: G * m in total, a quarter of the groups (G / 4)
// empty, the others alternating about 2m/3 and 2m rows, none above 2m (the case's capacity).
std::vector<int32_t> uneven_counts(int G, int m);

// The result document: {"meta": ..., "ceilings": {...}, "rows": [...]}.
plan::Json row_json(const Row& r);
plan::Json results_json(const plan::Json& meta, double hbm_GBps, double fp8_TFLOPs, const std::string& fp8_note,
                        const std::vector<Row>& rows, const plan::Json* keep_rows_from);
plan::Json layer_results_json(const plan::Json& meta, double hbm_GBps, double fp8_TFLOPs,
                              const std::vector<LayerRow>& rows);

}  // namespace epkit::moebench
