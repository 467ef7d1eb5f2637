// Command-line options of epkit-bench: one named-field struct, parsed and range-checked in one place.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "epkit/types.hpp"

namespace epkit::bench {

enum class RoutingKind { kUniform, kSkewed };
const char* routing_name(RoutingKind k);

enum class NcclMode { kAlltoAll, kSendRecv };
const char* nccl_mode_name(NcclMode m);

// What --smoke sets where the option itself is not given.
inline constexpr int kSmokeIters = 20, kSmokeWarmup = 2, kSmokeGraphIters = 2;
inline constexpr size_t kSmokeCeilingBytes = size_t{16} << 20;

struct Options {
  // Presets to run, in order (--preset, repeatable or comma list).
  std::vector<std::string> presets = {"decode", "decode-v2lite", "prefill"};
  // Overrides of preset fields; unset keeps the preset's value.
  std::optional<std::vector<int>> tokens;     // tokens per rank (per DP group), each >= 1
  std::optional<int> hidden;                  // H, >= 1 (the library wants a multiple of 16)
  std::optional<int> experts;                 // E, >= 1
  std::optional<int> topk;                    // K, 1..kMaxTopK
  std::optional<DType> dispatch_dtype;        // bf16, fp16 or fp8 (fp8 adds fp32 scales per 128)
  std::optional<DType> combine_dtype;         // bf16 or fp16, expert outputs and combined output
  int dp_size = 1;                            // ranks per DP group, >= 1
  int max_tokens = 0;                         // AllToAll's M; 0 = the row's token count
  int capacity = 0;                           // slots per local expert; 0 = library default
  // Expert layouts to run each row in (--layout, comma list): each row is measured once per layout.
  std::vector<ExpertLayout> layouts = {ExpertLayout::kMasked};
  RoutingKind routing = RoutingKind::kUniform;
  double zipf_s = 1.0;                        // skewed routing: popularity of the i-th expert ~ 1/(i+1)^s
  uint64_t seed = 1;                          // routing and input seed (per DP group it is mixed with the group index)
  int iters = 200;                            // timed samples per mode, >= 200 (p99 needs them); --smoke: 20
  int warmup = 20;                            // untimed iterations before each mode, >= 0
  int graph_iters = 10;                       // dispatch+combine pairs captured in one CUDA graph, >= 1
  bool portable = false;                      // force DataPath::kPortable
  bool weights_at_dispatch = false;           // AllToAllConfig::weights_at_dispatch
  bool profile_graph = false;                 // one more graph replay per case inside cudaProfilerStart/Stop
  bool device_m = false;                      // m passed on the device (num_tokens_device), as a graph for any m has it
  int num_sms = 0;                            // AllToAllConfig::num_sms; 0 = all
  bool baselines = true;                      // run the NCCL and NVSHMEM dense baselines
  NcclMode nccl_mode = NcclMode::kAlltoAll;   // ncclAlltoAll (if the NCCL build has it) or grouped send/recv
  size_t ceiling_bytes = size_t{256} << 20;   // size of the P2P copy used to measure the bandwidth ceiling
  // --smoke: every mode, baseline and probe runs with few samples (kSmoke* below, unless given), to
  // show that they run to completion; the numbers mean nothing and the table says so.
  bool smoke = false;
  std::string json_path;                      // --json FILE ("" = none)
  std::string csv_path;                       // --csv FILE ("" = none)
  bool help = false;
};

// Parses argv[1..] (without the program name). Throws epkit::Error naming the option, the bad value
// and the allowed range.
Options parse_options(const std::vector<std::string>& args);

// The --help text.
std::string usage();

// "1,4,8" -> {1, 4, 8}; throws naming `option` on an empty item, a non-number or a value below `min`.
std::vector<int> parse_int_list(const std::string& option, const std::string& text, int min);

}  // namespace epkit::bench
