// nvcc 13.0 (V13.0.88) miscompiles a copy of a local object that was built from a __grid_constant__
// kernel parameter: the copy's fields are loaded from the parameter space at the copy's own field
// offsets, i.e. from unrelated fields of the parameter, and what the constructor computed from
// threadIdx / blockDim is never read. Found in epkit's one-warp dispatch (src/kernels/local.cu,
// PieceUnits), where it only showed with one order of CommParams' fields. Without
// __grid_constant__, or with the object passed by reference instead of copied, the code is right.
//
//   bash tests/compiler/nvcc_has_the_bug.sh        (no GPU needed: looks at the PTX)
//   nvcc -O3 -arch=sm_90a -std=c++17 grid_constant_copy.cu -o gcc && ./gcc   (on a GPU: runs it)
#include <cstdint>
#include <cstdio>

struct Params {
  int topk, hidden, flag, b, c, d, e, f, g, h, i, j;  // 48 bytes of ints
  int* out;
  uint64_t kmul, nmul;
};

struct Units {
  int K, npc, units, gw, gstride;
  uint64_t kmul, nmul;
  bool scales = true;
  __device__ Units(const Params& p, int m)
      : K(p.topk), npc(p.hidden / 16), units(m * (p.hidden / 16) * p.topk), gw(threadIdx.x),
        gstride(blockDim.x), kmul(p.kmul), nmul(p.nmul) {}
};

__device__ __forceinline__ void body(const Params& p, const Units& pu) {
  Units u = pu;  // the copy
  u.scales = false;
  // At most 64 rounds: miscompiled, gstride is read from a parameter field that may hold 0.
  for (int q = u.gw, round = 0; q < u.units && round < 64; q += u.gstride, ++round) {
    const int t = static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(q)) * u.kmul) >> 32);
    const int k = static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(t)) * u.nmul) >> 32);
    p.out[q] = t * 1000 + k + (u.scales ? 1 : 0);
  }
}

__global__ void kernel(const __grid_constant__ Params p, int m) {
  const Units pu(p, m);
  if (p.flag) body(p, pu);
}

int main() {
  Params p{};
  p.topk = 8;
  p.hidden = 64;  // npc = 4: units = 32 m
  p.flag = 1;
  p.kmul = (uint64_t{1} << 32) / 8;  // q / 8
  p.nmul = (uint64_t{1} << 32) / 4;  // / 4
  const int m = 2, n = m * 4 * 8;
  if (cudaMalloc(&p.out, n * sizeof(int)) != cudaSuccess) { printf("no GPU\n"); return 2; }
  cudaMemset(p.out, 0xff, n * sizeof(int));
  kernel<<<1, 32>>>(p, m);
  int h[64];
  cudaMemcpy(h, p.out, n * sizeof(int), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int q = 0; q < n; ++q) bad += h[q] != (q / 8) * 1000 + (q / 8) / 4;
  printf("%d of %d outputs wrong (%s)\n", bad, n, bad ? "miscompiled" : "right");
  return bad ? 1 : 0;
}
