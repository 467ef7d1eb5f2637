// Dense all-to-all baselines on the sizes of a case, padded to the worst case the way
// torch.distributed.all_to_all_single is used for MoE: each rank sends [W][E/W][M][token_bytes],
// with dispatch token bytes (payload + scales) in one direction and combine token bytes in the other.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "bytes.hpp"
#include "epkit/communicator.hpp"
#include "options.hpp"
#include "presets.hpp"
#include "report.hpp"

namespace epkit::bench {

// GPUs the ranks run on (host name + PCI bus id), <= world size. Collective.
int distinct_gpus(const Communicator& comm);

// Bytes of one padded send (or receive) buffer of case config `cfg`: W chunks of the larger direction.
size_t dense_buffer_bytes(const AllToAllConfig& cfg);

// NCCL communicator over the same ranks, or the reason there is none (built without NCCL, several
// ranks on one GPU, init failure). Collective to construct.
class NcclBaseline {
 public:
  NcclBaseline(const Communicator& comm, NcclMode mode);
  ~NcclBaseline();
  NcclBaseline(const NcclBaseline&) = delete;
  NcclBaseline& operator=(const NcclBaseline&) = delete;

  bool available() const { return available_; }
  const std::string& unavailable_reason() const { return reason_; }
  std::string version() const;  // "2.28.9", or "none"
  // The "nccl" row of case `c`. Collective.
  Row run(const Case& c, const AlgorithmicBytes& bytes, const Options& opt, const Ceilings& ceilings,
          cudaStream_t stream);

 private:
  const Communicator& comm_;
  NcclMode mode_;
  bool available_ = false;
  std::string reason_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Why the NVSHMEM baseline cannot run here ("" if it can): NVSHMEM ends the process on its
// collectives when PEs share a GPU without MPS. The same on every rank.
std::string nvshmem_baseline_skip_reason(const Communicator& comm);

// The "nvshmem" row of case `c`: nvshmemx_alltoallmem_on_stream through Communicator::alltoall_on_stream
// on symmetric buffers, or a row whose note says why it was skipped. Collective.
Row run_nvshmem_baseline(const Communicator& comm, const Case& c, const AlgorithmicBytes& bytes, const Options& opt,
                         const Ceilings& ceilings, cudaStream_t stream);

}  // namespace epkit::bench
