// epkit-bench: dispatch/combine latency and bandwidth against dense all-to-all baselines (docs/BENCH.md).
// Run under epkit-run; rank 0 prints the table and writes --json / --csv.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "baselines.hpp"
#include "bytes.hpp"
#include "device.hpp"
#include "epkit/communicator.hpp"
#include "epkit/config.hpp"
#include "epkit/error.hpp"
#include "epkit/shapes.hpp"
#include "epkit/diagnostics.hpp"
#include "meta.hpp"
#include "options.hpp"
#include "presets.hpp"
#include "report.hpp"
#include "routing.hpp"
#include "run_epkit.hpp"
#include "timing.hpp"

namespace epkit::bench {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  return parse_int_list(name, v, 0).at(0);
}

// NVSHMEM reserves its symmetric heap at init, before any size is known to the library, so the bench
// sizes it for its largest case: the bigger of epkit's layout and the two padded NVSHMEM baseline
// buffers (cases run one after another), plus the copy probe and a margin. A user's setting wins.
void size_symmetric_heap(const std::vector<Case>& cases, const Options& opt, int rank) {
  if (std::getenv("NVSHMEM_SYMMETRIC_SIZE")) return;
  size_t need = 2 * opt.ceiling_bytes;
  for (const Case& c : cases) {
    need = std::max(need, symmetric_heap_bytes(c.cfg));
    if (opt.baselines) need = std::max(need, 2 * dense_buffer_bytes(c.cfg));
  }
  need += size_t{1} << 30;
  setenv("NVSHMEM_SYMMETRIC_SIZE", std::to_string(need).c_str(), 0);
  if (rank == 0) std::fprintf(stderr, "[epkit-bench] NVSHMEM_SYMMETRIC_SIZE=%zu (largest case + 1 GiB)\n", need);
}

Ceilings measure_ceilings(const Communicator& comm, const Options& opt, cudaStream_t stream) {
  Ceilings c;
  probes::CopyProbeOptions copt;
  copt.bytes = opt.ceiling_bytes;
  // --smoke: each probe still runs, with few samples (several ranks per GPU make every round trip a
  // context switch, which is what made the full probes slow there).
  probes::PingPongOptions popt;
  probes::LaunchFloorOptions lopt;
  if (opt.smoke) {
    copt.warmup = 1, copt.samples = 3;
    popt.round_trips = 10, popt.samples = 3;
    lopt.samples = opt.iters;
  }
  const probes::CopyProbeResult copy = probes::measure_copy_bandwidth(comm, copt, stream);
  c.p2p_method = copy.method;
  c.p2p_bytes = static_cast<int64_t>(copy.bytes);
  if (!copy.sample_us.empty()) {
    const Summary s = summarize_slowest(comm, copy.sample_us);
    c.p2p_us_median = s.median;
    c.p2p_us_p99 = s.p99;
    c.p2p_gbps = gb_per_s(static_cast<double>(copy.bytes), s.median);
  }
  const probes::CopyProbeResult hbm = probes::measure_local_copy_bandwidth(comm, copt, stream);
  c.hbm_copy_method = hbm.method;
  c.hbm_copy_bytes = static_cast<int64_t>(hbm.bytes);
  if (!hbm.sample_us.empty()) {
    c.hbm_copy_us_median = summarize_slowest(comm, hbm.sample_us).median;
    c.hbm_copy_gbps = gb_per_s(2.0 * static_cast<double>(hbm.bytes), c.hbm_copy_us_median);
  }
  const probes::PingPongResult pp = probes::measure_put_signal_latency(comm, popt, stream);
  c.put_signal_bytes = static_cast<int64_t>(pp.bytes);
  if (comm.world_size() < 2) {
    c.put_signal_method = "none: one rank has no peer";
  } else {
    c.put_signal_method = detail::concat("ranks 0<->1 ping-pong, nvshmemx_putmem_signal_nbi_warp + wait_until, ",
                                         pp.round_trips, " round trips per kernel, one-way = time / (2 * round trips)");
  }
  if (!pp.one_way_us.empty()) {
    const Summary s = summarize(pp.one_way_us);
    c.put_signal_us_median = s.median;
    c.put_signal_us_p99 = s.p99;
  }
  const probes::LaunchFloorResult lf = probes::measure_launch_floor(comm, lopt, stream);
  c.launch_floor_blocks = lf.blocks;
  c.empty_kernel_us_median = summarize_slowest(comm, lf.empty_us).median;
  c.empty_one_warp_us_median = summarize_slowest(comm, lf.empty_one_warp_us).median;
  if (!lf.exchange_us.empty()) c.flag_exchange_us_median = summarize_slowest(comm, lf.exchange_us).median;
  return c;
}

void write_outputs(const Report& rep, const Options& opt) {
  if (!opt.json_path.empty()) {
    std::ofstream f(opt.json_path);
    EPKIT_CHECK(f.good(), "--json: cannot open '", opt.json_path, "' for writing");
    write_json(f, rep);
  }
  if (!opt.csv_path.empty()) {
    std::ofstream f(opt.csv_path);
    EPKIT_CHECK(f.good(), "--csv: cannot open '", opt.csv_path, "' for writing");
    write_csv(f, rep);
  }
}

int run(const std::vector<std::string>& argv) {
  const Options opt = parse_options({argv.begin() + 1, argv.end()});
  if (opt.help) {
    std::cout << usage();
    return 0;
  }
  // Cases and their validation come before NVSHMEM starts: a bad option fails fast on every rank.
  const int world = env_int("WORLD_SIZE", 1), rank = env_int("RANK", 0);
  const std::vector<Case> cases = expand_cases(opt, world, rank);
  for (const Case& c : cases) validate(c.cfg);
  size_symmetric_heap(cases, opt, rank);

  Communicator comm = Communicator::from_env();
  EPKIT_CHECK(comm.world_size() == world, "WORLD_SIZE says ", world, " but the communicator has ",
              comm.world_size(), " ranks");
  const bool lead = comm.rank() == 0;
  Stream stream;

  Report rep;
  rep.notes = run_notes(comm.world_size(), distinct_gpus(comm), opt.smoke, opt.iters);
  if (lead)
    for (const std::string& n : rep.notes) std::fprintf(stderr, "[epkit-bench] NOTE: %s\n", n.c_str());
  rep.ceilings = measure_ceilings(comm, opt, stream.get());
  std::unique_ptr<NcclBaseline> nccl;
  if (opt.baselines) {
    nccl = std::make_unique<NcclBaseline>(comm, opt.nccl_mode);
    if (lead && !nccl->available()) std::fprintf(stderr, "[epkit-bench] NCCL baseline: %s\n", nccl->unavailable_reason().c_str());
    const std::string nvshmem_skip = nvshmem_baseline_skip_reason(comm);
    if (lead && !nvshmem_skip.empty()) std::fprintf(stderr, "[epkit-bench] NVSHMEM baseline: %s\n", nvshmem_skip.c_str());
  }
  if (lead) rep.meta = collect_meta(comm, nccl ? nccl->version() : "not run", argv);
  if (lead) write_outputs(rep, opt);

  for (const Case& c : cases) {
    // Every rank derives every group's routing: its own feeds the kernels, all of them count bytes.
    const AllToAllConfig& cfg = c.cfg;
    const RoutingSpec spec{c.routing, cfg.num_experts, cfg.topk, c.zipf_s, c.seed};
    std::vector<GroupRouting> groups;
    std::vector<std::vector<int32_t>> group_idx;
    for (int g = 0; g < cfg.world_size / cfg.dp_size; ++g) {
      groups.push_back(make_group_routing(spec, g, c.num_tokens));
      group_idx.push_back(groups.back().topk_idx);
    }
    const AlgorithmicBytes bytes = algorithmic_bytes(cfg, group_idx, c.num_tokens);
    const GroupRouting& mine = groups[cfg.rank / cfg.dp_size];

    rep.rows.push_back(run_epkit(comm, c, mine, bytes, opt, rep.ceilings, stream.get()));
    // The dense baselines do not depend on epkit's layout: once per row, with its first layout.
    if (opt.baselines && cfg.layout == opt.layouts.front()) {
      rep.rows.push_back(nccl->run(c, bytes, opt, rep.ceilings, stream.get()));
      rep.rows.push_back(run_nvshmem_baseline(comm, c, bytes, opt, rep.ceilings, stream.get()));
    }
    if (lead) {
      const Row& e = *std::find_if(rep.rows.rbegin(), rep.rows.rend(), [](const Row& r) { return r.system == "epkit"; });
      std::fprintf(stderr, "[epkit-bench] %s tokens=%d %s: epkit total %.1f us (median), graph %.1f us\n",
                   c.preset.c_str(), c.num_tokens, e.layout.c_str(), e.total_us_median, e.graph_total_us_median);
      write_outputs(rep, opt);  // after every case, so a later failure keeps the finished rows
    }
  }
  if (lead) print_table(std::cout, rep);
  comm.barrier();
  return 0;
}

}  // namespace
}  // namespace epkit::bench

int main(int argc, char** argv) {
  try {
    return epkit::bench::run(std::vector<std::string>(argv, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "epkit-bench: error: %s\n", e.what());
    return 1;
  }
}
