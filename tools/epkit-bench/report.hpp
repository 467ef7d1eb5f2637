// Results of one benchmark run and their three renderings: a table (stdout), JSON and CSV.
// JSON and CSV are written from the same field list, so they always hold the same numbers.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace epkit::bench {

inline constexpr double kNotMeasured = std::nan("");

// One (case, system) result. Latencies in microseconds, bytes in bytes, bandwidth in GB/s (1e9 B/s).
// kNotMeasured (NaN) marks numbers a system does not have; JSON writes null, CSV an empty cell.
struct Row {
  // Identity.
  std::string preset;
  int tokens = 0;               // m per rank (per DP group)
  int world_size = 0;
  std::string system;           // "epkit", "nccl" or "nvshmem"
  int dp_size = 1;
  int hidden = 0;
  int experts = 0;
  int topk = 0;
  int max_tokens = 0;           // AllToAll's M (also the padding of the dense baselines)
  std::string dispatch_dtype;
  std::string combine_dtype;
  std::string routing;
  std::string path;             // epkit: "auto" or "portable"; baselines: their method
  std::string layout;           // epkit: expert layout, "masked" or "packed"; baselines: ""
  int num_sms = 0;
  int p2p_peers = -1;           // epkit: peers reached by direct loads/stores
  std::string note;             // why a number is missing, if one is
  // Latency: fused calls (epkit) or one collective per direction (baselines); each sample is the
  // slowest rank's time, taken after a barrier.
  int64_t samples = 0;
  double dispatch_us_median = kNotMeasured, dispatch_us_p99 = kNotMeasured;
  double combine_us_median = kNotMeasured, combine_us_p99 = kNotMeasured;
  double total_us_median = kNotMeasured, total_us_p99 = kNotMeasured;
  // epkit split halves, timed in one sequence per sample.
  double dispatch_send_us_median = kNotMeasured, dispatch_send_us_p99 = kNotMeasured;
  double dispatch_recv_us_median = kNotMeasured, dispatch_recv_us_p99 = kNotMeasured;
  double combine_send_us_median = kNotMeasured, combine_send_us_p99 = kNotMeasured;
  double combine_recv_us_median = kNotMeasured, combine_recv_us_p99 = kNotMeasured;
  double split_total_us_median = kNotMeasured, split_total_us_p99 = kNotMeasured;
  // epkit dispatch+combine replayed from a CUDA graph, per pair.
  double graph_total_us_median = kNotMeasured, graph_total_us_p99 = kNotMeasured;
  // Bandwidth over algorithmic bytes (bytes.hpp), per rank, at the median latency.
  double dispatch_bytes_per_rank = kNotMeasured, combine_bytes_per_rank = kNotMeasured;
  double dispatch_gbps = kNotMeasured, combine_gbps = kNotMeasured;
  double dispatch_pct_of_ceiling = kNotMeasured, combine_pct_of_ceiling = kNotMeasured;
  // Dense baselines: bytes each rank puts on links per dispatch / combine (padding included).
  double dispatch_wire_bytes_per_rank = kNotMeasured, combine_wire_bytes_per_rank = kNotMeasured;
  // Memory per rank: NVSHMEM symmetric heap and local workspace the system takes, and the
  // bench-allocated device buffers (inputs, outputs, padded baseline buffers).
  int64_t symmetric_bytes = 0;
  int64_t workspace_bytes = 0;
  int64_t buffer_bytes = 0;
};

// Device ceilings measured at start.
struct Ceilings {
  double p2p_gbps = kNotMeasured;         // per direction, all ranks copying to rank+1 at once, at the median time
  double p2p_us_median = kNotMeasured;
  double p2p_us_p99 = kNotMeasured;
  int64_t p2p_bytes = 0;
  std::string p2p_method;                 // how it was measured, or why it was not
  double put_signal_us_median = kNotMeasured;  // one-way latency, half a round trip
  double put_signal_us_p99 = kNotMeasured;
  int64_t put_signal_bytes = 0;
  std::string put_signal_method;
  // Device memory: a local device-to-device copy on every rank at once; read + write bytes per second.
  double hbm_copy_gbps = kNotMeasured;
  double hbm_copy_us_median = kNotMeasured;
  int64_t hbm_copy_bytes = 0;
  std::string hbm_copy_method;
  // Harness floor of one timed call (barrier, event, kernel, event), library block shape.
  int launch_floor_blocks = 0;
  double empty_kernel_us_median = kNotMeasured;   // empty kernel
  double empty_one_warp_us_median = kNotMeasured; // empty kernel of one 32-thread block
  double flag_exchange_us_median = kNotMeasured;  // one flag to and from every P2P peer
};

struct Report {
  std::vector<std::pair<std::string, std::string>> meta;  // gpu, driver, versions, commit, date, command line
  std::vector<std::string> notes;  // how to read this run (run_notes), above the table and in the JSON
  Ceilings ceilings;
  std::vector<Row> rows;
};

using FieldValue = std::variant<std::string, int64_t, double>;
struct RowField {
  const char* name;
  std::function<FieldValue(const Row&)> get;
};
// Every Row field in output order: the column list of the CSV and the keys of each JSON row.
const std::vector<RowField>& row_fields();

// percentage of `gbps` in `ceiling_gbps`; NaN when either is not a positive number.
double pct_of(double gbps, double ceiling_gbps);

// Fills the bandwidth fields of a row whose latencies are set: the algorithmic bytes per rank of
// each direction, GB/s at the median time, and % of the P2P ceiling. epkit and the baselines use
// the same numerator so their percentages compare directly.
void set_bandwidth(Row& row, double dispatch_bytes_per_rank, double combine_bytes_per_rank, double ceiling_gbps);

// What a reader of the table must know about a run of `world_size` ranks on `gpus` distinct GPUs:
// world size 1 crosses no link; ranks sharing a GPU time-slice it; --smoke takes too few samples.
std::vector<std::string> run_notes(int world_size, int gpus, bool smoke, int iters);

void write_json(std::ostream& os, const Report& r);
void write_csv(std::ostream& os, const Report& r);
void print_table(std::ostream& os, const Report& r);

// JSON string literal with escapes.
std::string json_quote(const std::string& s);

}  // namespace epkit::bench
