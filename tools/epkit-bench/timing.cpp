#include "timing.hpp"

#include "device.hpp"
#include "epkit/error.hpp"
#include "epkit/diagnostics.hpp"

namespace epkit::bench {

EventGrid::EventGrid(int samples, int marks) : samples_(samples), marks_(marks) {
  events_.resize(static_cast<size_t>(samples) * marks, nullptr);
  for (cudaEvent_t& e : events_) cuda_check(cudaEventCreate(&e), "cudaEventCreate");
}

EventGrid::~EventGrid() {
  for (cudaEvent_t e : events_) {
    if (e) cudaEventDestroy(e);
  }
}

void EventGrid::record(int sample, int mark, cudaStream_t stream) {
  cuda_check(cudaEventRecord(events_[static_cast<size_t>(sample) * marks_ + mark], stream), "cudaEventRecord");
}

std::vector<double> EventGrid::span_us(int from, int to) const {
  EPKIT_CHECK(from >= 0 && to < marks_ && from < to, "EventGrid::span_us(", from, ", ", to, ") with ", marks_,
              " marks");
  std::vector<double> out(samples_);
  for (int s = 0; s < samples_; ++s) {
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, events_[static_cast<size_t>(s) * marks_ + from],
                                    events_[static_cast<size_t>(s) * marks_ + to]),
               "cudaEventElapsedTime");
    out[s] = 1000.0 * ms;
  }
  return out;
}

void time_samples(const Communicator& comm, cudaStream_t stream, EventGrid& ev,
                  std::initializer_list<std::function<void()>> steps) {
  EPKIT_CHECK(static_cast<int>(steps.size()) + 1 == ev.marks(), "time_samples: ", steps.size(), " steps need ",
              steps.size() + 1, " marks, the grid has ", ev.marks());
  probes::HostGate gate;
  probes::queue_gated(gate, stream, ev.samples(), kGateBatch, [&](int i) {
    comm.barrier_on_stream(stream);
    int mark = 0;
    ev.record(i, mark++, stream);
    for (const auto& step : steps) {
      step();
      ev.record(i, mark++, stream);
    }
  });
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

std::vector<double> slowest_rank(const Communicator& comm, const std::vector<double>& mine) {
  const int world = comm.world_size();
  std::vector<double> all(mine.size() * static_cast<size_t>(world));
  comm.allgather(mine.data(), mine.size() * sizeof(double), all.data());
  std::vector<std::vector<double>> per_rank(world);
  for (int r = 0; r < world; ++r) {
    per_rank[r].assign(all.begin() + static_cast<ptrdiff_t>(r * mine.size()),
                       all.begin() + static_cast<ptrdiff_t>((r + 1) * mine.size()));
  }
  return max_over_ranks(per_rank);
}

Summary summarize_slowest(const Communicator& comm, const std::vector<double>& mine) {
  return summarize(slowest_rank(comm, mine));
}

}  // namespace epkit::bench
