// A small symmetric control block per process for host-driven collectives that work everywhere,
// including several PEs per GPU without MPS, where NVSHMEM's own collectives are unavailable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace epkit::transport {

constexpr size_t kControlChunk = 4096;  // bytes per rank per allgather round

// Allocates the block (collective); call right after NVSHMEM init.
void control_init(int world_size);
// Frees it (collective) unless peers are unreachable.
void control_finalize();
// Barrier over all PEs on `stream` (graph-capturable): every PE signals every PE, then waits.
// A wait longer than the collective timeout is recorded and raised by the next control_check().
void control_barrier_on_stream(cudaStream_t stream);
// Host-blocking barrier and allgather (n bytes per rank into out[world * n]); throw on timeout.
void control_barrier();
void control_allgather(const void* data, size_t n, void* out);
// Throws epkit::Error if an on-stream barrier timed out.
void control_check();
// Whether this PE maps PE `pe`'s symmetric heap (nvshmem_ptr on the control block is non-null).
bool control_maps_peer(int pe);

}  // namespace epkit::transport
