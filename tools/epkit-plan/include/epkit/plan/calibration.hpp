// Measured times that replace or check modelled terms: the JSON that epkit-bench (dispatch/combine)
// and epkit-moe (MoE kernels, and the whole MoE layer) write. docs/PLANNER.md, "Calibration".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "epkit/plan/config.hpp"
#include "epkit/plan/json.hpp"
#include "epkit/plan/specs.hpp"

namespace epkit::plan {

// One epkit-bench row: medians of dispatch and combine for `tokens` tokens per rank on `world_size` ranks.
struct CommMeasurement {
  std::string preset;
  std::string system;       // epkit | nccl | nvshmem
  int world_size = 0;
  int tokens = 0;           // tokens per rank
  double dispatch_us = 0;   // dispatch_us_median
  double combine_us = 0;    // combine_us_median
  double total_us = 0;      // total_us_median
  double total_p99_us = 0;  // total_us_p99 (0 when absent)
};

// One epkit-moe kernel row: a standalone kernel at one shape, timed in a CUDA graph with the L2 flushed.
struct KernelMeasurement {
  std::string kernel;       // grouped_gemm | router | quantize | silu_mul_quantize
  std::string variant;      // up_gate, down (grouped_gemm); deepseek_grouped_topk (router); activations; masked
  std::string device;       // the file's meta.device ("" when absent)
  std::string source;       // file it came from
  int groups = 0;           // G
  int m = 0;                // rows per group (grouped_gemm, silu_mul_quantize); tokens (router, quantize)
  int n = 0, k = 0;         // N, K as the row states them (0 when the kernel has no such dimension)
  double us = 0;            // us_median
  double bytes = 0;         // bytes the kernel must move
  double weight_bytes = 0;  // grouped_gemm: weight + scale bytes of the groups with rows
  double flops = 0;
  double hbm_GBps = 0;      // the file's measured HBM read ceiling, GB/s
  double fp8_TFLOPs = 0;    // the file's measured FP8 dense ceiling, TFLOP/s
  // Fraction of the roofline at the file's ceilings: max(mem / hbm, flops / fp8) / us, where mem is
  // weight_bytes when > 0 (epkit-moe's rule for GEMMs) and bytes otherwise. Equals pct_of_ceiling / 100.
  double roofline_fraction() const;
};

// One step of epkit-moe's layer breakdown: a kernel of the layer alone, in a graph, µs.
struct LayerStepMeasurement {
  std::string step;  // gate, router, quantize, dispatch, combine, gemm_w13, silu_mul_quantize, gemm_w2, ...
  double us = 0;
};

// One epkit-moe layer row: the MoE layer (gate GEMM to combine, plus the shared expert) on one GPU.
struct LayerMeasurement {
  std::string schedule;      // none | dispatch_overlap | microbatch
  std::string layout;        // masked | packed
  std::string shared = "in_stream";  // concurrent | in_stream: where the shared expert ran (absent: in_stream)
  std::string gate_router;   // fused | separate: gate GEMM + router in one kernel or two ("" when absent)
  std::string device;        // the file's meta.device ("" when absent)
  std::string source;        // file it came from
  std::string note;
  int world_size = 0;        // W ranks
  int experts = 0;           // routed experts on this GPU (E / W)
  int batch = 0;             // requests per rank
  int query_len = 0;         // tokens per request
  int tokens = 0;            // batch * query_len, per rank
  double us = 0;             // us_median: one forward launched from the host, µs
  double graph_us = 0;       // graph_us_median: forwards replayed from a CUDA graph, µs
  double graph_p99_us = 0;   // graph_us_p99 (0 when absent)
  std::vector<LayerStepMeasurement> breakdown;  // schedule none only (may be empty)
};

// The measurements one planner run uses, from any number of files.
struct Calibration {
  std::string source;                      // file names, comma-separated, for the report
  std::vector<std::string> sources;        // the same, one per file
  std::vector<CommMeasurement> comm;       // epkit-bench rows of the chosen system that match the model
  std::vector<KernelMeasurement> kernels;  // epkit-moe kernel rows of system epkit, default variants only
  std::vector<LayerMeasurement> layers;    // epkit-moe layer rows
  int kernel_rows_ignored = 0;             // other systems, and variants the planner does not use (uneven, config sweeps)
  int layer_rows_ignored = 0;              // the same-run A/B rows that turn the fused gate + router off
};

// Measured dispatch and combine times, µs, for one configuration.
struct CommLookup {
  double dispatch_us = 0;
  double combine_us = 0;
  bool interpolated = false;  // linear in tokens between two measured token counts
};

// Reads one results file. Each row's kind is detected on its own: rows with dispatch_us_median are
// epkit-bench's, rows with kernel == "moe_layer" epkit-moe's layer rows, other rows with `kernel`
// epkit-moe's kernel rows. Keeps epkit-bench rows of `system` that match the model (shape fields
// hidden/experts/topk when present, else the preset name; fp8 dispatch; path auto; dp_size 1; uniform
// routing) and epkit-moe kernel rows of system epkit. Throws epkit::Error naming a malformed row or field.
Calibration calibration_from_json(const Json& j, const ModelSpec& m, const std::string& system = "epkit");
// As above, from a file.
Calibration load_calibration(const std::string& path, const ModelSpec& m, const std::string& system = "epkit");
// Several files merged in order; throws epkit::Error when two files hold the same kernel or layer point.
Calibration load_calibrations(const std::vector<std::string>& paths, const ModelSpec& m,
                              const std::string& system = "epkit");

// Measured times for `world_size` ranks and `tokens` tokens per rank: exact, or interpolated between the
// nearest measured token counts at that world size; nullopt outside the measured range.
std::optional<CommLookup> lookup_comm(const Calibration& cal, int world_size, double tokens);

// A kernel the planner wants a measured time for.
struct KernelQuery {
  std::string kernel;    // as in KernelMeasurement
  std::string variant;   // "" matches any variant (then exactly one variant may match)
  int n = 0;             // N the rows must have
  int k = -1;            // K the rows must have; -1 matches any
  double groups = 1;     // the planner's G; may be fractional (expected touched experts)
  double m = 0;          // rows per group
  std::string gpu;       // the planner's GPU spec name; rows measured on another device are not used
};

// A measured time for a KernelQuery, or why there is none.
struct KernelLookup {
  bool found = false;
  double time_us = 0;         // µs
  int groups_used = 0;        // the measured G the rows came from (the nearest to the query's)
  bool interpolated = false;  // between two measured points
  std::string what;           // found: which rows; else why not (e.g. "m = 0.5 outside the measured [1, 4096]")
};

// Measured time of one kernel. The rows of the matching kernel/variant/shape at the measured G nearest
// to q.groups (in ratio) give the roofline fraction f, interpolated linearly in log f over log x; x is
// rows per group for grouped_gemm and all rows (G * m) for the other kernels. Bytes and FLOP are
// interpolated linearly in x and, for grouped_gemm, scaled by q.groups / G. Time = roofline at the rows'
// ceilings / f. Outside the measured x range: not found (no extrapolation).
KernelLookup lookup_kernel(const Calibration& cal, const KernelQuery& q);

// A measured layer row for a planner point, or why there is none.
struct LayerMatch {
  const LayerMeasurement* row = nullptr;
  std::string kind;  // "exact": world_size == ep and experts == E / ep; "w1_proxy": one GPU holding E / ep experts
  std::string why;   // when row is null
};

// The layer row for EP `ep`, TP `tp`, `batch` requests per DP group of `query_len` tokens, under
// `schedule`, measured on `gpu`: an exact row first, else a W = 1 row with the same experts per GPU and
// tokens (the same rows per expert, no network). Only TP1 points match (the layer has no TP groups).
// A masked-layout row is preferred over a packed one.
LayerMatch find_layer_row(const Calibration& cal, const ModelSpec& m, const std::string& gpu, int ep, int tp,
                          int batch, int query_len, Schedule schedule);

// The epkit-moe schedule name of a planner schedule: none, dispatch_overlap, microbatch.
std::string layer_schedule_name(Schedule s);

}  // namespace epkit::plan
