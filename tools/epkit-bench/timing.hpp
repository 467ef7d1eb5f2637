// CUDA-event timing of repeated samples, and the cross-rank combination of their times.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <initializer_list>
#include <vector>

#include "epkit/communicator.hpp"
#include "stats.hpp"

namespace epkit::bench {

// Samples queued per probes::HostGate batch: each sample is at most ~7 queued operations, so a
// batch stays far below the launch queue's depth.
inline constexpr int kGateBatch = 16;

// `samples` x `marks` events, created up front so recording adds no allocation to the timed loop.
class EventGrid {
 public:
  EventGrid(int samples, int marks);
  ~EventGrid();
  EventGrid(const EventGrid&) = delete;
  EventGrid& operator=(const EventGrid&) = delete;

  int samples() const { return samples_; }
  int marks() const { return marks_; }
  void record(int sample, int mark, cudaStream_t stream);
  // Microseconds from mark `from` to mark `to` of every sample (call after the stream is synchronised).
  std::vector<double> span_us(int from, int to) const;

 private:
  int samples_, marks_;
  std::vector<cudaEvent_t> events_;
};

// The timed loop of every bench mode: for each of ev.samples() samples, an on-stream barrier (so skew
// is not hidden), mark 0, then each step followed by the next mark (ev.marks() == steps + 1).
// Samples are queued kGateBatch at a time behind a probes::HostGate, so the events time device
// work rather than the host's launch rate. Returns once the stream has finished them.
void time_samples(const Communicator& comm, cudaStream_t stream, EventGrid& ev,
                  std::initializer_list<std::function<void()>> steps);

// Per-sample maximum over all ranks of this rank's samples (collective; every rank gets the result).
std::vector<double> slowest_rank(const Communicator& comm, const std::vector<double>& mine);

// slowest_rank, then summarize.
Summary summarize_slowest(const Communicator& comm, const std::vector<double>& mine);

}  // namespace epkit::bench
