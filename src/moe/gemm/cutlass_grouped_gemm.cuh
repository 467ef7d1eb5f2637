// One grouped-GEMM instantiation: CUTLASS's Hopper ptr-array grouped GEMM with FP8 blockwise scaling
// (KernelPtrArrayTmaWarpSpecialized{Pingpong,Cooperative}FP8Blockwise), and the small kernel that
// writes its per-group arguments from the device counts. Included only by src/moe/gemm/<id>.cu, one
// config each (they take ~1.5 min apiece to compile).
//
// How the pieces fit:
// - The problem shapes live on the device only (host shapes = nullptr). CUTLASS then launches one
//   persistent CTA per SM (or per SM pair with a cluster) and its group tile scheduler walks the
//   groups' tiles from the device shapes: ceil(M_g / tile_m) * ceil(N_g / tile_n) tiles per group, so a
//   group with 0 rows has no tile (its weights are never loaded) and a group's last token tile is
//   the only partial one. TMA zero-fills the token rows past the count (no memory traffic), the
//   scale loads are predicated on the row, and the TMA store is clipped to the group's rows, so
//   rows past the count are neither read nor written.
// - Everything CUTLASS reads per group (shapes, pointers, strides, scale layouts) sits in fixed
//   arrays of this object's workspace, so the CUTLASS Params (and the TMA descriptor templates in
//   them) are built once, in the constructor; each run rewrites the arrays with write_group_args,
//   then launches the GEMM with those Params. Neither step allocates or synchronises. Gemm::
//   initialize only sets the kernel's shared-memory attribute here: every initialize_workspace on
//   this path (mainloop, ptr-array epilogue, LinearCombination, group scheduler) is a no-op, so no
//   memset happens at all.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/util/packed_stride.hpp"
#include "epkit/error.hpp"
#include "moe/gemm/group_rows.cuh"
#include "moe/gemm/gemm_impl.hpp"

namespace epkit::moe::detail {

// The CUTLASS types of one config. A and B are both K-major (what FP8 wgmma needs and what the
// checkpoint and dispatch give). With swap-AB, A = weights [N, K] (128 x 128 scale blocks, M = N) and
// B = tokens [rows, K] (1 x 128 scale blocks), and D^T column-major is the row-major [rows, N] output.
// Without it, A = tokens and B = weights, and D is row-major [rows, N].
template <bool kSwap, bool kPingpong, int kTileM, int kTileN, int kClusterM, int kClusterN>
struct CutlassGemmTypes {
  static constexpr bool kSwapAB = kSwap;
  using ElementAB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using LayoutA = cutlass::layout::RowMajor;     // M x K, K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // N x K, K contiguous
  using LayoutD = std::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignAB = 16;  // elements: 16 bytes for TMA
  static constexpr int kAlignD = 8;    // 16 bytes of bf16
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<kSwap ? 128 : 1, kSwap ? 1 : 128, 128,
                                                                cute::GMMA::Major::K, cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using TileShape = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<128>>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;
  using MainloopSchedule = std::conditional_t<kPingpong, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
                                              cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>;
  using EpilogueSchedule = std::conditional_t<kPingpong, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                                              cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;  // (M, N, K) per group

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,  //
      void, LayoutD*, kAlignD,                                        // no C source
      ElementD, LayoutD*, kAlignD, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,  //
      ElementAB, cute::tuple<LayoutA*, LayoutSFA*>, kAlignAB,  //
      ElementAB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignAB,  //
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
};

// The per-group arrays CUTLASS reads, carved out of the object's workspace.
template <class T>
struct GroupArrays {
  typename T::Shape3* shapes = nullptr;
  const typename T::ElementAB** ptr_a = nullptr;
  const typename T::ElementAB** ptr_b = nullptr;
  const float** ptr_sfa = nullptr;
  const float** ptr_sfb = nullptr;
  typename T::ElementD** ptr_d = nullptr;
  typename T::StrideA* stride_a = nullptr;
  typename T::StrideB* stride_b = nullptr;
  typename T::StrideD* stride_d = nullptr;
  typename T::LayoutSFA* layout_sfa = nullptr;
  typename T::LayoutSFB* layout_sfb = nullptr;
};

// The fixed sizes the per-group kernel needs.
struct GroupDims {
  int num_groups, n, k, rows;
  bool packed;
};

// One thread per group: the group's row range from the counts (and offsets), clamped or skipped as
// ExpertLayout's contract says, then its problem shape and pointers. M_g (tokens) = 0 gives the
// group no tiles.
template <class T>
__global__ void write_group_args(GroupArrays<T> w, GemmLaunch in, GroupDims dims) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= dims.num_groups) return;
  const int N = dims.n, K = dims.k, S = dims.k / 128, NB = (dims.n + 127) / 128;
  const GroupRows gr = group_rows(in.counts, in.offsets, g, dims.rows, dims.packed, in.error);
  const int count = gr.count;
  const int64_t row0 = gr.row0;
  using EAB = typename T::ElementAB;
  const EAB* tokens = reinterpret_cast<const EAB*>(in.a) + row0 * K;
  const float* token_scales = in.a_scale + row0 * S;
  const EAB* weights = reinterpret_cast<const EAB*>(in.b) + static_cast<int64_t>(g) * N * K;
  const float* weight_scales = in.b_scale + static_cast<int64_t>(g) * NB * S;
  typename T::ElementD* out = reinterpret_cast<typename T::ElementD*>(in.d) + row0 * N;
  if constexpr (T::kSwapAB) {
    w.shapes[g] = typename T::Shape3{N, count, K};
    w.ptr_a[g] = weights;
    w.ptr_sfa[g] = weight_scales;
    w.ptr_b[g] = tokens;
    w.ptr_sfb[g] = token_scales;
    w.stride_a[g] = cutlass::make_cute_packed_stride(typename T::StrideA{}, {N, K, 1});
    w.stride_b[g] = cutlass::make_cute_packed_stride(typename T::StrideB{}, {count, K, 1});
    w.stride_d[g] = cutlass::make_cute_packed_stride(typename T::StrideD{}, {N, count, 1});  // column-major: ld = N
    w.layout_sfa[g] = T::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(N, count, K, 1));
    w.layout_sfb[g] = T::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(N, count, K, 1));
  } else {
    w.shapes[g] = typename T::Shape3{count, N, K};
    w.ptr_a[g] = tokens;
    w.ptr_sfa[g] = token_scales;
    w.ptr_b[g] = weights;
    w.ptr_sfb[g] = weight_scales;
    w.stride_a[g] = cutlass::make_cute_packed_stride(typename T::StrideA{}, {count, K, 1});
    w.stride_b[g] = cutlass::make_cute_packed_stride(typename T::StrideB{}, {N, K, 1});
    w.stride_d[g] = cutlass::make_cute_packed_stride(typename T::StrideD{}, {count, N, 1});  // row-major: ld = N
    w.layout_sfa[g] = T::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(count, N, K, 1));
    w.layout_sfb[g] = T::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(count, N, K, 1));
  }
  w.ptr_d[g] = out;
}

template <class T>
class CutlassGroupedGemm final : public GemmImpl {
  using Kernel = typename T::Kernel;
  using Gemm = typename T::Gemm;
  static constexpr int kClusterSize = cute::size(typename T::ClusterShape{});

 public:
  CutlassGroupedGemm(const GroupedGemmShape& shape, const GemmConfig& cfg) : GemmImpl(shape, cfg) {
    const GemmDevice dev = current_gemm_device(cfg_);
    device_ = dev.device;
    const int sm_count = dev.sm_count, smem_optin = dev.smem_optin;
    const int smem = Kernel::SharedStorageSize;
    EPKIT_CHECK(smem <= smem_optin, "grouped GEMM ", to_string(cfg_), ": needs ", smem,
                " bytes of shared memory per block, device ", device_, " allows ", smem_optin);
    gemm_cuda_check(cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute", cfg_);
    cutlass::KernelHardwareInfo hw{device_, sm_count, 0};
    if constexpr (kClusterSize > 1) hw.max_active_clusters = max_active_clusters(smem);

    // The arrays first, then CUTLASS's own workspace (per-SM TMA descriptors), in one allocation.
    const int G = shape_.num_groups;
    size_t off = 0;
    auto take = [&](size_t bytes) {
      const size_t at = off;
      off = (off + bytes + 127) / 128 * 128;
      return at;
    };
    const size_t o_shapes = take(sizeof(typename T::Shape3) * G), o_pa = take(sizeof(void*) * G),
                 o_pb = take(sizeof(void*) * G), o_psfa = take(sizeof(void*) * G), o_psfb = take(sizeof(void*) * G),
                 o_pd = take(sizeof(void*) * G), o_sa = take(sizeof(typename T::StrideA) * G),
                 o_sb = take(sizeof(typename T::StrideB) * G), o_sd = take(sizeof(typename T::StrideD) * G),
                 o_lsfa = take(sizeof(typename T::LayoutSFA) * G), o_lsfb = take(sizeof(typename T::LayoutSFB) * G);
    typename Gemm::Arguments args = make_arguments(hw);  // null arrays: only the size is asked
    const size_t o_cutlass = take(Gemm::get_workspace_size(args));
    bytes_ = off;
    void* p = nullptr;
    gemm_cuda_check(cudaMalloc(&p, bytes_), "cudaMalloc of the workspace", cfg_);
    ws_ = static_cast<char*>(p);
    auto at = [&](size_t o) { return static_cast<void*>(ws_ + o); };
    arrays_.shapes = static_cast<typename T::Shape3*>(at(o_shapes));
    arrays_.ptr_a = static_cast<const typename T::ElementAB**>(at(o_pa));
    arrays_.ptr_b = static_cast<const typename T::ElementAB**>(at(o_pb));
    arrays_.ptr_sfa = static_cast<const float**>(at(o_psfa));
    arrays_.ptr_sfb = static_cast<const float**>(at(o_psfb));
    arrays_.ptr_d = static_cast<typename T::ElementD**>(at(o_pd));
    arrays_.stride_a = static_cast<typename T::StrideA*>(at(o_sa));
    arrays_.stride_b = static_cast<typename T::StrideB*>(at(o_sb));
    arrays_.stride_d = static_cast<typename T::StrideD*>(at(o_sd));
    arrays_.layout_sfa = static_cast<typename T::LayoutSFA*>(at(o_lsfa));
    arrays_.layout_sfb = static_cast<typename T::LayoutSFB*>(at(o_lsfb));

    args = make_arguments(hw);
    cutlass::Status st = gemm_.can_implement(args);
    EPKIT_CHECK(st == cutlass::Status::kSuccess, "grouped GEMM ", to_string(cfg_),
                ": CUTLASS cannot implement the arguments: ", cutlassGetStatusString(st));
    st = gemm_.initialize(args, at(o_cutlass), nullptr);
    EPKIT_CHECK(st == cutlass::Status::kSuccess, "grouped GEMM ", to_string(cfg_),
                ": CUTLASS initialize failed: ", cutlassGetStatusString(st));
  }

  ~CutlassGroupedGemm() override {
    if (ws_) cudaFree(ws_);
  }

  void run(const GemmLaunch& launch, cudaStream_t stream) override {
    const GroupDims dims{shape_.num_groups, shape_.n, shape_.k, shape_.rows, shape_.layout == ExpertLayout::kPacked};
    constexpr int kThreads = 128;
    write_group_args<T><<<(dims.num_groups + kThreads - 1) / kThreads, kThreads, 0, stream>>>(arrays_, launch, dims);
    gemm_cuda_check(cudaGetLastError(), "launch of the per-group argument kernel", cfg_);
    const cutlass::Status st = gemm_.run(stream);
    EPKIT_CHECK(st == cutlass::Status::kSuccess, "grouped GEMM ", to_string(cfg_),
                ": CUTLASS launch failed: ", cutlassGetStatusString(st));
  }

  size_t workspace_bytes() const override { return bytes_; }

 private:
  typename Gemm::Arguments make_arguments(const cutlass::KernelHardwareInfo& hw) const {
    typename T::Mainloop::Arguments mainloop{arrays_.ptr_a, arrays_.stride_a, arrays_.ptr_b, arrays_.stride_b,
                                             arrays_.ptr_sfa, arrays_.layout_sfa, arrays_.ptr_sfb, arrays_.layout_sfb};
    typename T::Epilogue::Arguments epilogue{{}, nullptr, nullptr, arrays_.ptr_d, arrays_.stride_d};  // D = 1 * acc
    return typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                    {shape_.num_groups, arrays_.shapes, nullptr},  // host shapes: none
                                    mainloop, epilogue, hw};
  }

  // Clusters that fit at once (after the shared-memory attribute is set): CUTLASS sizes the
  // persistent grid from it.
  int max_active_clusters(int smem) const {
    cudaLaunchConfig_t lc{};
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cute::size<0>(typename T::ClusterShape{});
    attr.val.clusterDim.y = cute::size<1>(typename T::ClusterShape{});
    attr.val.clusterDim.z = 1;
    lc.gridDim = dim3(attr.val.clusterDim.x, attr.val.clusterDim.y, 1);
    lc.blockDim = dim3(Kernel::MaxThreadsPerBlock, 1, 1);
    lc.dynamicSmemBytes = static_cast<size_t>(smem);
    lc.attrs = &attr;
    lc.numAttrs = 1;
    int n = 0;
    gemm_cuda_check(cudaOccupancyMaxActiveClusters(&n, cutlass::device_kernel<Kernel>, &lc),
               "cudaOccupancyMaxActiveClusters", cfg_);
    EPKIT_CHECK(n > 0, "grouped GEMM ", to_string(cfg_), ": no cluster of ", kClusterSize, " CTAs fits on device ",
                device_);
    return n;
  }

  char* ws_ = nullptr;
  size_t bytes_ = 0;
  GroupArrays<T> arrays_;
  Gemm gemm_;
};

}  // namespace epkit::moe::detail

// The config types of every entry (aliases only: nothing is instantiated until a TU uses one).
#define EPKIT_GEMM_CONFIG(id, swap, sched, tm, tn, cm, cn)                                                     \
  namespace epkit::moe::detail {                                                                             \
  using id##_types = CutlassGemmTypes<swap, GemmSchedule::sched == GemmSchedule::kPingpong, tm, tn, cm, cn>; \
  inline constexpr GemmConfig id##_config{tm, tn, 128, swap, GemmSchedule::sched, cm, cn};                   \
  }
#include "moe/gemm/gemm_configs.def"

// The body of src/moe/gemm/<id>.cu: the factory declared in gemm_impl.hpp.
#define EPKIT_GEMM_DEFINE(id)                                                                 \
  namespace epkit::moe::detail {                                                              \
  std::unique_ptr<GemmImpl> make_gemm_##id(const GroupedGemmShape& shape) {                   \
    return std::make_unique<CutlassGroupedGemm<id##_types>>(shape, id##_config);              \
  }                                                                                           \
  }
