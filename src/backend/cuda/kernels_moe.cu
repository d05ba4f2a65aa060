// Mixture-of-experts routing kernels (ir/ops_moe.cc), the device twins of
// backend/cpu/kernels_moe.cc: top-k, slot assignment, dispatch, combine and their gradients.
// f32 (the backend widens bf16/f16 around them); the routing tensors are small next to the
// experts' GEMMs.
#include <cub/block/block_scan.cuh>

#include "backend/cuda/kernels.h"
#include "ir/top_k_row.h"

namespace tessera::cuda {

namespace {

int32_t* iout(const Args& a, int i) { return static_cast<int32_t*>(a.out[static_cast<size_t>(i)]); }

// One thread per row (grid-stride), each its top_k_row (ir/top_k_row.h).
__global__ void top_k_kernel(const float* x, float* values, int32_t* idx, int64_t rows, int64_t n,
                             int64_t k) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x)
    top_k_row(x + r * n, n, k, values + r * k, idx + r * k);
}

__global__ void top_k_grad_kernel(const float* dv, const int32_t* idx, float* dx, int64_t rows,
                                  int64_t n, int64_t k) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * k;
       i += int64_t{gridDim.x} * blockDim.x)
    atomicAdd(&dx[(i / k) * n + idx[i]], dv[i]);
}

// One block per expert: the routes in choice-major order (every token's first choice, then the
// second choices), scanned in chunks of the block's threads; each route of this expert takes
// the next position, a slot while it is under the capacity.
constexpr int kScanThreads = 256;
__global__ void moe_slots_kernel(const int32_t* idx, int32_t* slots, int64_t tokens, int64_t k,
                                 int64_t capacity) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  const int32_t e = static_cast<int32_t>(blockIdx.x);
  const int64_t routes = tokens * k;
  int64_t base = 0;
  for (int64_t start = 0; start < routes; start += kScanThreads) {
    const int64_t r = start + threadIdx.x;  // choice r / tokens of token r % tokens
    const int64_t at = r < routes ? (r % tokens) * k + r / tokens : -1;
    const int mine = at >= 0 && idx[at] == e ? 1 : 0;
    int before = 0, total = 0;
    Scan(temp).ExclusiveSum(mine, before, total);
    if (mine) {
      const int64_t pos = base + before;
      slots[at] = pos < capacity ? static_cast<int32_t>(e * capacity + pos) : -1;
    }
    base += total;
    __syncthreads();  // temp is reused by the next chunk's scan
  }
}

// One thread per (route, element): its row into its slot, times its weight.
__global__ void moe_dispatch_kernel(const float* x, const int32_t* slots, const float* w,
                                    float* buf, int64_t routes, int64_t k, int64_t d) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < routes * d;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / d, c = i % d;
    const int64_t s = slots[r];
    if (s < 0) continue;
    buf[s * d + c] = (w != nullptr ? w[r] : 1.0f) * x[(r / k) * d + c];
  }
}

// One thread per (token, element): the weighted sum of its routes' slots.
__global__ void moe_combine_kernel(const float* y, const int32_t* slots, const float* w, float* out,
                                   int64_t tokens, int64_t k, int64_t d) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < tokens * d;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / d, c = i % d;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = slots[t * k + j];
      if (s >= 0) sum += (w != nullptr ? w[t * k + j] : 1.0f) * y[s * d + c];
    }
    out[i] = sum;
  }
}

// One warp per route (grid-stride over the routes): dot(a[token], y[slot]).
__global__ void moe_combine_grad_kernel(const float* a, const float* y, const int32_t* slots,
                                        float* dw, int64_t routes, int64_t k, int64_t d) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * blockDim.x / 32;
  for (int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; r < routes;
       r += warps) {  // the same count of passes for every lane of a warp
    const int64_t s = slots[r];
    float sum = 0.0f;
    if (s >= 0)
      for (int64_t c = lane; c < d; c += 32) sum += a[(r / k) * d + c] * y[s * d + c];
    for (int off = 16; off > 0; off /= 2) sum += __shfl_down_sync(0xffffffffu, sum, off);
    if (lane == 0) dw[r] = sum;
  }
}

void top_k(OpKind, const Args& a) {
  const int64_t n = a.in_shape(0)[-1], k = a.attr<TopKAttrs>().k;
  const int64_t rows = a.in_shape(0).numel() / n;
  top_k_kernel<<<blocks_for(rows), 256, 0, a.stream>>>(a.fin(0), a.fout(0), iout(a, 1), rows, n, k);
  TS_CUDA_LAUNCH();
}

void top_k_grad(OpKind, const Args& a) {
  const TopKAttrs& t = a.attr<TopKAttrs>();
  const int64_t rows = a.in_shape(0).numel() / t.k;
  TS_CUDA(cudaMemsetAsync(a.fout(0), 0, static_cast<size_t>(rows * t.n) * sizeof(float), a.stream));
  top_k_grad_kernel<<<blocks_for(rows * t.k), 256, 0, a.stream>>>(a.fin(0), a.iin(1), a.fout(0),
                                                                  rows, t.n, t.k);
  TS_CUDA_LAUNCH();
}

void moe_slots(OpKind, const Args& a) {
  const MoeAttrs& m = a.attr<MoeAttrs>();
  moe_slots_kernel<<<static_cast<unsigned>(m.experts), kScanThreads, 0, a.stream>>>(
      a.iin(0), iout(a, 0), a.in_shape(0)[0], a.in_shape(0)[1], m.capacity);
  TS_CUDA_LAUNCH();
}

void moe_dispatch(OpKind, const Args& a) {
  const int64_t routes = a.in_shape(1).numel(), k = a.in_shape(1)[1], d = a.in_shape(0)[1];
  TS_CUDA(cudaMemsetAsync(a.fout(0), 0, static_cast<size_t>(a.out_shape(0).numel()) * sizeof(float),
                          a.stream));
  const float* w = a.num_inputs() == 3 ? a.fin(2) : nullptr;
  moe_dispatch_kernel<<<blocks_for(routes * d), 256, 0, a.stream>>>(a.fin(0), a.iin(1), w,
                                                                    a.fout(0), routes, k, d);
  TS_CUDA_LAUNCH();
}

void moe_combine(OpKind, const Args& a) {
  const int64_t tokens = a.in_shape(1)[0], k = a.in_shape(1)[1], d = a.in_shape(0)[2];
  const float* w = a.num_inputs() == 3 ? a.fin(2) : nullptr;
  moe_combine_kernel<<<blocks_for(tokens * d), 256, 0, a.stream>>>(a.fin(0), a.iin(1), w, a.fout(0),
                                                                   tokens, k, d);
  TS_CUDA_LAUNCH();
}

void moe_combine_grad(OpKind, const Args& a) {
  const int64_t routes = a.in_shape(2).numel(), k = a.in_shape(2)[1], d = a.in_shape(0)[1];
  moe_combine_grad_kernel<<<blocks_for(routes * 32), 256, 0, a.stream>>>(
      a.fin(0), a.fin(1), a.iin(2), a.fout(0), routes, k, d);
  TS_CUDA_LAUNCH();
}

}  // namespace

void register_moe_kernels(KernelTable& t) {
  t.add(OpKind::top_k, top_k);
  t.add(OpKind::top_k_grad, top_k_grad);
  t.add(OpKind::moe_slots, moe_slots);
  t.add(OpKind::moe_dispatch, moe_dispatch);
  t.add(OpKind::moe_combine, moe_combine);
  t.add(OpKind::moe_combine_grad, moe_combine_grad);
}

}  // namespace tessera::cuda
