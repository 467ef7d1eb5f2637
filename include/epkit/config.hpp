// AllToAllConfig: the one description of an expert-parallel dispatch/combine instance.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "epkit/types.hpp"

namespace epkit {

// Which data path peers are reached by.
enum class DataPath : int32_t {
  kAuto = 0,      // direct loads/stores where nvshmem_ptr gives a peer address (P2P), put-with-signal elsewhere
  kPortable = 1,  // NVSHMEM put-with-signal for every peer, even P2P ones (what crosses nodes)
};

struct AllToAllConfig {
  int world_size = 0;           // W: number of ranks (PEs) taking part
  int rank = -1;                // this rank, 0 <= rank < W
  int dp_size = 1;              // D: ranks per DP group; the D ranks of a group hold identical tokens. W % D == 0
  int num_experts = 0;          // E: routed experts; E % W == 0, expert e lives on rank e / (E / W)
  int topk = 0;    // K: top-k, 1..16
  int hidden = 0;               // H: elements per token; a multiple of 16
  int max_tokens_per_rank = 0;  // M: most tokens one rank (one DP group) passes to dispatch
  DType dispatch_dtype = DType::kBF16;    // payload: bf16, fp16 or fp8_e4m3 (fp8 carries fp32 scales per 128)
  DType combine_in_dtype = DType::kBF16;  // expert outputs: bf16, fp16 or fp32
  DType combine_out_dtype = DType::kBF16; // combined output: bf16 or fp16
  // How dispatch lays out expert_x (and combine reads expert_y): kMasked is [L, capacity, H];
  // kPacked is [R, H] with each local expert's rows back to back from an aligned offset (layout.hpp).
  ExpertLayout layout = ExpertLayout::kMasked;
  int capacity = 0;             // masked only: slots per local expert; 0 means M * (W / D): no overflow while each token lists an expert at most once
  int packed_rows = 0;          // packed only: R, rows of expert_x; 0 means packed_row_bound(): no overflow while each token lists an expert at most once
  // packed only: every expert's first row is a multiple of this. 1 (the default) suits grouped GEMMs
  // that take a pointer per expert (epkit's own: rows stay 16-byte aligned since H % 16 == 0); 128
  // suits DeepGEMM's m-grouped contiguous layout, whose tiles must not straddle two experts.
  int packed_row_align = 1;
  DataPath path = DataPath::kAuto;
  int num_sms = 0;              // blocks (one per SM) the kernels may use; 0 means all SMs
  int timeout_ms = -1;          // bound on every device-side wait; -1 means env EPKIT_TIMEOUT_MS, else 10000
  // When true, dispatch takes the router weights with the indices and carries them in each message,
  // and combine takes none: combine then needs no weight exchange (one network round trip fewer).
  bool weights_at_dispatch = false;
  // masked fp8 only: expert_x_scale is [E/W, ceil(H/128), capacity] instead of [E/W, capacity,
  // ceil(H/128)]: each expert's scales token-minor ("MN-major"), the layout DeepGEMM's masked
  // grouped GEMM reads and DeepEP's low-latency dispatch returns (a transposed view of it), written
  // so by dispatch itself instead of by a transposing copy after it.
  bool expert_scales_mn_major = false;
};

// Throws epkit::Error naming the first field that is out of range and its limit.
void validate(const AllToAllConfig& cfg);

// Derived quantities. All take a validated config.
int num_local_experts(const AllToAllConfig& cfg);     // E / W
int num_dp_groups(const AllToAllConfig& cfg);         // W / D
int scales_per_token(const AllToAllConfig& cfg);      // ceil(H / 128) for fp8, else 0
int effective_capacity(const AllToAllConfig& cfg);    // capacity or M * (W / D)
int max_tokens_per_sender(const AllToAllConfig& cfg); // ceil(M / D): tokens one rank of a group sends
bool has_scales(const AllToAllConfig& cfg);           // dispatch_dtype is fp8
int resolved_timeout_ms(const AllToAllConfig& cfg);   // timeout_ms with the env default applied
// The rank of DP group `group` that sends the group's token `token` in dispatch: tokens are dealt
// round-robin over the group's D ranks (token t goes out from group * D + t % D).
inline int dp_sender_rank(const AllToAllConfig& cfg, int group, int token) {
  return group * cfg.dp_size + token % cfg.dp_size;
}

// The fields every rank must agree on, as (name, value) pairs; rank-specific fields are left out.
std::vector<std::pair<std::string, int64_t>> agreement_fields(const AllToAllConfig& cfg);

std::string to_string(const AllToAllConfig& cfg);

}  // namespace epkit
