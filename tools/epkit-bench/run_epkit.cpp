#include "run_epkit.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>

#include "device.hpp"
#include "epkit/all_to_all.hpp"
#include "epkit/error.hpp"
#include "epkit/shapes.hpp"
#include "epkit/diagnostics.hpp"
#include "timing.hpp"

namespace epkit::bench {

namespace {

// Owns a captured graph and its executable instance.
struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

void set_median_p99(const Summary& s, double& median, double& p99) {
  median = s.median;
  p99 = s.p99;
}

}  // namespace

Row make_row_identity(const Case& c, const char* system) {
  Row r;
  r.preset = c.preset;
  r.tokens = c.num_tokens;
  r.world_size = c.cfg.world_size;
  r.system = system;
  r.dp_size = c.cfg.dp_size;
  r.hidden = c.cfg.hidden;
  r.experts = c.cfg.num_experts;
  r.topk = c.cfg.topk;
  r.max_tokens = c.cfg.max_tokens_per_rank;
  r.dispatch_dtype = dtype_name(c.cfg.dispatch_dtype);
  r.combine_dtype = dtype_name(c.cfg.combine_out_dtype);
  r.routing = routing_name(c.routing);
  r.num_sms = c.cfg.num_sms;
  return r;
}

Row run_epkit(const Communicator& comm, const Case& c, const GroupRouting& mine, const AlgorithmicBytes& bytes,
              const Options& opt, const Ceilings& ceilings, cudaStream_t stream) {
  const AllToAllConfig& cfg = c.cfg;
  Row row = make_row_identity(c, "epkit");
  row.path = std::string(cfg.path == DataPath::kPortable ? "portable" : "auto") +
             (cfg.weights_at_dispatch ? "+weights-at-dispatch" : "") + (opt.device_m ? "+device-m" : "");
  row.layout = layout_name(cfg.layout);

  AllToAll a2a(comm, cfg);
  row.symmetric_bytes = static_cast<int64_t>(a2a.symmetric_bytes());
  row.workspace_bytes = static_cast<int64_t>(a2a.workspace_bytes());
  row.p2p_peers = a2a.num_p2p_peers();

  const int64_t M = cfg.max_tokens_per_rank, H = cfg.hidden, K = cfg.topk;
  const int64_t L = num_local_experts(cfg), rows = expert_rows(cfg), S = scales_per_token(cfg);
  const bool packed = cfg.layout == ExpertLayout::kPacked;
  // The expert-major view of a buffer in the config's layout, trailing dim `inner`.
  auto expert_view = [&](void* p, DType t, int64_t inner) {
    return packed ? Tensor(p, t, {rows, inner}) : Tensor(p, t, {L, effective_capacity(cfg), inner});
  };
  const int m = c.num_tokens;
  const DType dd = cfg.dispatch_dtype, cin = cfg.combine_in_dtype, cout = cfg.combine_out_dtype;
  const bool fp8 = has_scales(cfg);

  DeviceBuffer x(M * H * dtype_size(dd), "x");
  DeviceBuffer x_scale(fp8 ? M * S * 4 : 0, "x_scale");
  DeviceBuffer topk_idx(M * K * 4, "topk_idx");
  DeviceBuffer topk_w(M * K * 4, "topk_weights");
  DeviceBuffer expert_x(rows * H * dtype_size(dd), "expert_x");
  DeviceBuffer expert_x_scale(fp8 ? rows * S * 4 : 0, "expert_x_scale");
  DeviceBuffer expert_num(L * 4, "expert_num_tokens");
  DeviceBuffer expert_offsets(packed ? (L + 1) * 4 : 0, "expert_offsets");
  DeviceBuffer expert_y(rows * H * dtype_size(cin), "expert_y");
  DeviceBuffer out(M * H * dtype_size(cout), "out");
  DeviceBuffer m_dev(opt.device_m ? 4 : 0, "num_tokens_device");
  if (opt.device_m) {
    const int32_t mv = m;
    copy_to_device(m_dev.get(), &mv, 4);
  }
  row.buffer_bytes = static_cast<int64_t>(x.bytes() + x_scale.bytes() + topk_idx.bytes() + topk_w.bytes() +
                                          expert_x.bytes() + expert_x_scale.bytes() + expert_num.bytes() +
                                          expert_offsets.bytes() + expert_y.bytes() + out.bytes());

  // The D ranks of a group must feed identical tokens: the seed depends on the group only.
  const uint64_t group_seed = mix_seed(c.seed, 1000 + static_cast<uint64_t>(cfg.rank / cfg.dp_size));
  fill_random(x.get(), dd, static_cast<size_t>(M * H), group_seed);
  if (fp8) fill_random(x_scale.get(), DType::kFP32, static_cast<size_t>(M * S), group_seed + 1);
  // Expert outputs are whatever the "experts" produced; any finite values do for timing.
  fill_random(expert_y.get(), cin, static_cast<size_t>(rows * H), mix_seed(c.seed, 2000 + cfg.rank));
  std::vector<int32_t> idx(static_cast<size_t>(M * K), -1);
  std::vector<float> w(static_cast<size_t>(M * K), 0.f);
  std::copy(mine.topk_idx.begin(), mine.topk_idx.end(), idx.begin());
  std::copy(mine.topk_weights.begin(), mine.topk_weights.end(), w.begin());
  copy_to_device(topk_idx.get(), idx.data(), idx.size() * 4);
  copy_to_device(topk_w.get(), w.data(), w.size() * 4);

  DispatchArgs d;
  d.x = Tensor(x.get(), dd, {M, H});
  if (fp8) d.x_scale = Tensor(x_scale.get(), DType::kFP32, {M, S});
  d.topk_idx = Tensor(topk_idx.get(), DType::kInt32, {M, K});
  d.num_tokens = opt.device_m ? -1 : m;
  d.num_tokens_device = opt.device_m ? static_cast<const int32_t*>(m_dev.get()) : nullptr;
  d.expert_x = expert_view(expert_x.get(), dd, H);
  if (fp8) d.expert_x_scale = expert_view(expert_x_scale.get(), DType::kFP32, S);
  d.expert_num_tokens = Tensor(expert_num.get(), DType::kInt32, {L});
  if (packed) d.expert_offsets = Tensor(expert_offsets.get(), DType::kInt32, {L + 1});
  CombineArgs cb;
  cb.expert_y = expert_view(expert_y.get(), cin, H);
  cb.topk_idx = d.topk_idx;
  // With weights_at_dispatch the weights ride in the dispatch messages and combine takes none.
  (cfg.weights_at_dispatch ? d.topk_weights : cb.topk_weights) = Tensor(topk_w.get(), DType::kFP32, {M, K});
  cb.num_tokens = d.num_tokens;
  cb.num_tokens_device = d.num_tokens_device;
  cb.out = Tensor(out.get(), cout, {M, H});

  auto finish = [&] {
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    a2a.check();
  };
  auto warm_up = [&] {
    for (int i = 0; i < opt.warmup; ++i) {
      a2a.dispatch(d, stream);
      a2a.combine(cb, stream);
    }
    finish();
  };
  const int n = opt.iters;

  // Split halves, all four in one sequence per sample: shows where the time goes.
  warm_up();
  {
    EventGrid ev(n, 5);
    time_samples(comm, stream, ev,
                 {[&] { a2a.dispatch_send(d, stream); }, [&] { a2a.dispatch_recv(d, stream); },
                  [&] { a2a.combine_send(cb, stream); }, [&] { a2a.combine_recv(cb, stream); }});
    a2a.check();
    set_median_p99(summarize_slowest(comm, ev.span_us(0, 1)), row.dispatch_send_us_median, row.dispatch_send_us_p99);
    set_median_p99(summarize_slowest(comm, ev.span_us(1, 2)), row.dispatch_recv_us_median, row.dispatch_recv_us_p99);
    set_median_p99(summarize_slowest(comm, ev.span_us(2, 3)), row.combine_send_us_median, row.combine_send_us_p99);
    set_median_p99(summarize_slowest(comm, ev.span_us(3, 4)), row.combine_recv_us_median, row.combine_recv_us_p99);
    set_median_p99(summarize_slowest(comm, ev.span_us(0, 4)), row.split_total_us_median, row.split_total_us_p99);
  }

  // Fused calls: the headline dispatch / combine / total.
  warm_up();
  {
    EventGrid ev(n, 3);
    time_samples(comm, stream, ev, {[&] { a2a.dispatch(d, stream); }, [&] { a2a.combine(cb, stream); }});
    a2a.check();
    set_median_p99(summarize_slowest(comm, ev.span_us(0, 1)), row.dispatch_us_median, row.dispatch_us_p99);
    set_median_p99(summarize_slowest(comm, ev.span_us(1, 2)), row.combine_us_median, row.combine_us_p99);
    set_median_p99(summarize_slowest(comm, ev.span_us(0, 2)), row.total_us_median, row.total_us_p99);
    row.samples = n;
  }

  // Graph replay: graph_iters dispatch+combine pairs per launch, so launch gaps are the graph's, not
  // the host's; each sample is one replay divided by graph_iters.
  {
    Graph g;
    cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      for (int i = 0; i < opt.graph_iters; ++i) {
        a2a.dispatch(d, stream);
        a2a.combine(cb, stream);
      }
    } catch (...) {
      cudaStreamEndCapture(stream, &g.graph);
      throw;
    }
    cuda_check(cudaStreamEndCapture(stream, &g.graph), "cudaStreamEndCapture");
    cuda_check(cudaGraphInstantiate(&g.exec, g.graph, 0), "cudaGraphInstantiate");
    for (int i = 0; i < 2; ++i) cuda_check(cudaGraphLaunch(g.exec, stream), "cudaGraphLaunch");
    finish();
    EventGrid ev(n, 2);
    time_samples(comm, stream, ev, {[&] { cuda_check(cudaGraphLaunch(g.exec, stream), "cudaGraphLaunch"); }});
    a2a.check();
    std::vector<double> per_pair = ev.span_us(0, 1);
    for (double& v : per_pair) v /= opt.graph_iters;
    set_median_p99(summarize_slowest(comm, per_pair), row.graph_total_us_median, row.graph_total_us_p99);
    if (opt.profile_graph) {
      // One replay as the timed ones ran (caches as the previous replay left them), the only work
      // inside the profiler's range: the probes' host-gated kernels hang under ncu's replay, and
      // counting launches to skip them broke whenever the setup's launches changed.
      cuda_check(cudaProfilerStart(), "cudaProfilerStart");
      cuda_check(cudaGraphLaunch(g.exec, stream), "cudaGraphLaunch");
      finish();
      cuda_check(cudaProfilerStop(), "cudaProfilerStop");
      a2a.check();
    }
  }


  set_bandwidth(row, bytes.dispatch_per_rank, bytes.combine_per_rank, ceilings.p2p_gbps);
  return row;
}

}  // namespace epkit::bench
