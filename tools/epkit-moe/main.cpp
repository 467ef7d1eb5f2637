// epkit-moe: the MoE compute benchmark (docs/MOE.md, docs/PERF.md). One process on one GPU; the
// kernel mode needs neither NVSHMEM nor a launcher. Every system is timed with one method
// (gpu_util.hpp: time_graph) against ceilings measured at the start of the same run.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "bench_core.hpp"
#include "ceilings.hpp"
#include "epkit/error.hpp"
#include "epkit/version.hpp"
#include "gpu_util.hpp"
#include "kernels_bench.hpp"
#include "layer_bench.hpp"

namespace epkit::moebench {
namespace {

plan::Json meta_json(const std::vector<std::string>& argv) {
  plan::Json m = plan::Json::object();
  cudaDeviceProp p{};
  int dev = 0, driver = 0, runtime = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::string cmd;
  for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  m.set("date_utc", date).set("commit", epkit::git_commit());
  m.set("device", p.name).set("sms", p.multiProcessorCount).set("l2_bytes", p.l2CacheSize);
  m.set("hbm_bytes", static_cast<double>(p.totalGlobalMem));
  m.set("cuda_driver", driver).set("cuda_runtime", runtime).set("command", cmd);
  m.set("method",
        "each point: N back-to-back calls (20 below 1 ms) captured in one CUDA graph, replayed R times "
        "with the L2 flushed (untimed) before every replay, CUDA events per replay divided by N; median "
        "and p99 over replays; inputs rotated over sets that together exceed 4x the L2");
  return m;
}

int run(const std::vector<std::string>& argv) {
  const Options o = parse_options(std::vector<std::string>(argv.begin() + 1, argv.end()));
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("epkit-moe: no GPU on this machine; nothing to benchmark.\n");
    return 0;
  }
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  const plan::Json meta = meta_json(argv);
  std::printf("epkit-moe %s on %s\n", o.mode.c_str(), meta.at("device").as_string().c_str());
  const Ceilings c = measure_ceilings(s, o.quick);
  std::printf("ceilings: HBM read %.0f GB/s, FP8 dense %.0f TFLOP/s (%s)\n", c.hbm_read_GBps, c.fp8_dense_TFLOPs,
              c.fp8_note.c_str());
  const L2Flush flush;
  std::vector<Row> rows;
  if (o.mode == "kernels") {
    for (const std::string& k : o.kernels) {
      std::printf("== %s\n", k.c_str());
      std::vector<Row> r = k == "router"              ? bench_router(o, c, flush, s)
                           : k == "gate_router"       ? bench_gate_router(o, c, flush, s)
                           : k == "quantize"          ? bench_quantize(o, c, flush, s)
                           : k == "silu_mul_quantize" ? bench_silu_mul_quantize(o, c, flush, s)
                                                      : bench_grouped_gemm(o, c, flush, s);
      rows.insert(rows.end(), r.begin(), r.end());
    }
  } else {
    if (!o.json.empty())
      set_layer_checkpoint([&] {
        std::ofstream f(o.json);
        f << layer_results_json(meta, c.hbm_read_GBps, c.fp8_dense_TFLOPs, last_layer_rows()).dump(1) << "\n";
      });
    rows = bench_layer(o, c, flush, s);
  }
  cudaStreamDestroy(s);
  if (!o.json.empty() && (o.mode != "layer" || layer_rank0())) {
    plan::Json old;
    const bool merge = !o.merge.empty();
    if (merge) old = plan::read_json_file(o.merge);
    const plan::Json doc =
        o.mode == "layer" ? layer_results_json(meta, c.hbm_read_GBps, c.fp8_dense_TFLOPs, last_layer_rows())
                          : results_json(meta, c.hbm_read_GBps, c.fp8_dense_TFLOPs, c.fp8_note, rows, merge ? &old : nullptr);
    std::ofstream f(o.json);
    EPKIT_CHECK(f.good(), "cannot write ", o.json);
    f << doc.dump(1) << "\n";
    std::printf("wrote %s (%zu rows)\n", o.json.c_str(), o.mode == "layer" ? last_layer_rows().size() : rows.size());
  }
  return 0;
}

}  // namespace
}  // namespace epkit::moebench

int main(int argc, char** argv) {
  try {
    return epkit::moebench::run(std::vector<std::string>(argv, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "epkit-moe: %s\n", e.what());
    return 1;
  }
}
