#include "options.hpp"

#include <charconv>
#include <sstream>

#include "epkit/error.hpp"

namespace epkit::bench {

const char* routing_name(RoutingKind k) { return k == RoutingKind::kUniform ? "uniform" : "skewed"; }
const char* nccl_mode_name(NcclMode m) { return m == NcclMode::kAlltoAll ? "alltoall" : "sendrecv"; }

namespace {

int64_t parse_int(const std::string& option, const std::string& text, int64_t min, int64_t max) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  EPKIT_CHECK(ec == std::errc() && p == end && !text.empty(), option, ": '", text, "' is not an integer");
  EPKIT_CHECK(v >= min && v <= max, option, ": ", v, " is out of range [", min, ", ", max, "]");
  return v;
}

double parse_double(const std::string& option, const std::string& text, double min, double max) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  EPKIT_CHECK(used == text.size() && !text.empty(), option, ": '", text, "' is not a number");
  EPKIT_CHECK(v >= min && v <= max, option, ": ", v, " is out of range [", min, ", ", max, "]");
  return v;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream is(text);
  while (std::getline(is, item, ',')) out.push_back(item);
  if (!text.empty() && text.back() == ',') out.push_back("");
  return out;
}

DType parse_payload_dtype(const std::string& option, const std::string& v, bool allow_fp8) {
  if (v == "bf16") return DType::kBF16;
  if (v == "fp16") return DType::kFP16;
  if (allow_fp8 && (v == "fp8" || v == "fp8_e4m3")) return DType::kFP8E4M3;
  EPKIT_FAIL(option, ": '", v, "' is not one of ", allow_fp8 ? "bf16, fp16, fp8" : "bf16, fp16");
}

constexpr int64_t kIntMax = 1 << 30;

}  // namespace

std::vector<int> parse_int_list(const std::string& option, const std::string& text, int min) {
  std::vector<int> out;
  for (const std::string& item : split_commas(text)) {
    EPKIT_CHECK(!item.empty(), option, ": empty item in '", text, "'");
    out.push_back(static_cast<int>(parse_int(option, item, min, kIntMax)));
  }
  EPKIT_CHECK(!out.empty(), option, ": needs at least one value");
  return out;
}

Options parse_options(const std::vector<std::string>& args) {
  Options o;
  bool presets_given = false;
  bool iters_given = false, warmup_given = false, graph_iters_given = false, ceiling_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    std::string value;
    bool has_inline = false;
    if (const size_t eq = name.find('='); name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_inline = true;
    }
    // Flags take no value.
    auto flag = [&](bool& field) {
      EPKIT_CHECK(!has_inline, name, " takes no value (got '", value, "')");
      field = true;
    };
    auto next = [&]() -> std::string {
      if (has_inline) return value;
      EPKIT_CHECK(i + 1 < args.size(), name, " needs a value");
      return args[++i];
    };
    if (name == "--help" || name == "-h") {
      flag(o.help);
    } else if (name == "--portable") {
      flag(o.portable);
    } else if (name == "--weights-at-dispatch") {
      flag(o.weights_at_dispatch);
    } else if (name == "--profile-graph") {
      flag(o.profile_graph);
    } else if (name == "--device-m") {
      flag(o.device_m);
    } else if (name == "--smoke") {
      flag(o.smoke);
    } else if (name == "--no-baselines") {
      bool off = false;
      flag(off);
      o.baselines = false;
    } else if (name == "--preset") {
      if (!presets_given) o.presets.clear();
      presets_given = true;
      const std::string v = next();
      for (const std::string& p : split_commas(v)) {
        EPKIT_CHECK(!p.empty(), "--preset: empty item in '", v, "'");
        o.presets.push_back(p);
      }
    } else if (name == "--tokens") {
      o.tokens = parse_int_list(name, next(), 1);
    } else if (name == "--hidden") {
      o.hidden = static_cast<int>(parse_int(name, next(), 1, kIntMax));
    } else if (name == "--experts") {
      o.experts = static_cast<int>(parse_int(name, next(), 1, kIntMax));
    } else if (name == "--topk") {
      o.topk = static_cast<int>(parse_int(name, next(), 1, kMaxTopK));
    } else if (name == "--dispatch-dtype") {
      o.dispatch_dtype = parse_payload_dtype(name, next(), true);
    } else if (name == "--combine-dtype") {
      o.combine_dtype = parse_payload_dtype(name, next(), false);
    } else if (name == "--dp-size") {
      o.dp_size = static_cast<int>(parse_int(name, next(), 1, kIntMax));
    } else if (name == "--max-tokens") {
      o.max_tokens = static_cast<int>(parse_int(name, next(), 0, kIntMax));
    } else if (name == "--capacity") {
      o.capacity = static_cast<int>(parse_int(name, next(), 0, kIntMax));
    } else if (name == "--layout") {
      const std::string v = next();
      o.layouts.clear();
      for (const std::string& l : split_commas(v)) {
        if (l == "masked") {
          o.layouts.push_back(ExpertLayout::kMasked);
        } else if (l == "packed") {
          o.layouts.push_back(ExpertLayout::kPacked);
        } else {
          EPKIT_FAIL("--layout: '", l, "' is not one of masked, packed");
        }
      }
    } else if (name == "--routing") {
      const std::string v = next();
      if (v == "uniform") {
        o.routing = RoutingKind::kUniform;
      } else if (v == "skewed") {
        o.routing = RoutingKind::kSkewed;
      } else {
        EPKIT_FAIL("--routing: '", v, "' is not one of uniform, skewed");
      }
    } else if (name == "--zipf-s") {
      o.zipf_s = parse_double(name, next(), 0.0, 8.0);
    } else if (name == "--seed") {
      o.seed = static_cast<uint64_t>(parse_int(name, next(), 0, INT64_MAX));
    } else if (name == "--iters") {
      iters_given = true;
      o.iters = static_cast<int>(parse_int(name, next(), 200, 1000000));
    } else if (name == "--warmup") {
      warmup_given = true;
      o.warmup = static_cast<int>(parse_int(name, next(), 0, 1000000));
    } else if (name == "--graph-iters") {
      graph_iters_given = true;
      o.graph_iters = static_cast<int>(parse_int(name, next(), 1, 1000));
    } else if (name == "--num-sms") {
      o.num_sms = static_cast<int>(parse_int(name, next(), 0, 1024));
    } else if (name == "--nccl-mode") {
      const std::string v = next();
      if (v == "alltoall") {
        o.nccl_mode = NcclMode::kAlltoAll;
      } else if (v == "sendrecv") {
        o.nccl_mode = NcclMode::kSendRecv;
      } else {
        EPKIT_FAIL("--nccl-mode: '", v, "' is not one of alltoall, sendrecv");
      }
    } else if (name == "--ceiling-mib") {
      ceiling_given = true;
      o.ceiling_bytes = static_cast<size_t>(parse_int(name, next(), 1, 16384)) << 20;
    } else if (name == "--json") {
      o.json_path = next();
      EPKIT_CHECK(!o.json_path.empty(), "--json needs a file name");
    } else if (name == "--csv") {
      o.csv_path = next();
      EPKIT_CHECK(!o.csv_path.empty(), "--csv needs a file name");
    } else {
      EPKIT_FAIL("unknown option '", args[i], "' (see --help)");
    }
  }
  EPKIT_CHECK(!o.presets.empty(), "--preset: needs at least one preset");
  if (o.smoke) {
    if (!iters_given) o.iters = kSmokeIters;
    if (!warmup_given) o.warmup = kSmokeWarmup;
    if (!graph_iters_given) o.graph_iters = kSmokeGraphIters;
    if (!ceiling_given) o.ceiling_bytes = kSmokeCeilingBytes;
  }
  return o;
}

std::string usage() {
  return R"(epkit-bench: dispatch/combine latency and bandwidth of epkit against dense all-to-all baselines.
Run as: epkit-run -n N epkit-bench [options]

  --preset P[,P...]      decode, decode-v2lite, prefill (repeatable; default: all three)
  --tokens N[,N...]      tokens per rank (per DP group); overrides the preset's list
  --hidden H             hidden size
  --experts E            routed experts (E % world_size == 0)
  --topk K               experts per token, 1..16
  --dispatch-dtype T     bf16 | fp16 | fp8 (fp8 carries fp32 scales per 128 elements)
  --combine-dtype T      bf16 | fp16 (expert outputs and combined output)
  --dp-size D            ranks per DP group (they share tokens and routing); default 1
  --max-tokens M         AllToAll's max_tokens_per_rank; default: the row's token count
  --capacity C           slots per local expert; default: the library's (never overflows)
  --layout L[,L]         expert layout of dispatch/combine: masked ([E/W, capacity, H]) | packed ([R, H]);
                         a list runs every row in each; default masked
  --routing R            uniform | skewed (Zipf expert popularity, see --zipf-s); default uniform
  --zipf-s S             skew exponent of --routing skewed, 0..8; default 1.0
  --seed N               routing/input seed; default 1
  --iters N              timed samples per mode, >= 200; default 200
  --warmup N             untimed iterations before each mode; default 20
  --graph-iters N        dispatch+combine pairs per captured CUDA graph; default 10
  --portable             force DataPath::kPortable (put-with-signal to every peer)
  --weights-at-dispatch  router weights travel with dispatch; combine exchanges none
  --profile-graph        after the timed graph replays, one more replay per case between
                         cudaProfilerStart and cudaProfilerStop: the steady state's kernels, for
                         ncu --profile-from-start off --graph-profiling graph
  --device-m             pass m on the device (num_tokens_device: one int32, as a graph that serves
                         every m has it) instead of on the host; rows get the path suffix +device-m
  --num-sms N            blocks the kernels may use; default 0 = all SMs
  --smoke                check that every mode, baseline and probe runs: 20 samples, 2 warm-up, 2 graph
                         pairs, a 16 MiB copy probe (unless given); the numbers are not measurements
  --no-baselines         skip the NCCL and NVSHMEM dense all-to-all baselines
  --nccl-mode M          alltoall (ncclAlltoAll where the NCCL build has it) | sendrecv (grouped, as torch does)
  --ceiling-mib N        bytes of the P2P copy that measures the bandwidth ceiling; default 256
  --json FILE            write every number as JSON (rank 0)
  --csv FILE             write the rows as CSV (rank 0)
  --help                 this text
)";
}

}  // namespace epkit::bench
