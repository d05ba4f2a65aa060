// The optimizer's device passes (backend/cuda/optim.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/kernels.h"
#include "backend/cuda/optim.h"
#include "base/check.h"

namespace tessera::cuda {
namespace {

constexpr int kThreads = 256;

// Element i of a gradient or parameter stored as dt, as f32, and back.
__device__ float load(const void* p, DType dt, int64_t i) {
  if (dt == DType::bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (dt == DType::f16) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
__device__ void store(void* p, DType dt, int64_t i, float x) {
  if (dt == DType::bf16)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
  else if (dt == DType::f16)
    static_cast<__half*>(p)[i] = __float2half_rn(x);
  else
    static_cast<float*>(p)[i] = x;
}

// Sums a block's values in a fixed tree order; thread 0 gets the total.
__device__ double block_sum(double x) {
  __shared__ double s[kThreads];
  s[threadIdx.x] = x;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
    __syncthreads();
  }
  return s[0];
}

// The sum of squares of x[first, end) (dt elements) in double, in a fixed order; every thread
// gets it. The single-tensor and multi-tensor passes use this one function for a chunk.
__device__ double chunk_squares(const void* x, DType dt, int64_t first, int64_t end) {
  double acc = 0;
  for (int64_t i = first + threadIdx.x; i < end; i += kThreads) {
    const double v = load(x, dt, i);
    acc += v * v;
  }
  return block_sum(acc);
}

// parts[0] + ... + parts[count - 1] in a fixed order (threads stride, then the block's tree).
__device__ double ordered_sum(const double* parts, int64_t count) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) acc += parts[i];
  return block_sum(acc);
}

// Block c's chunk: its tensor and element range [first, end).
struct Chunk {
  const OptimTensor* t;
  int64_t first, end;
};
__device__ Chunk chunk_of(const OptimTensors& l) {
  const OptimTensor* t = l.tensors + l.chunk_tensor[blockIdx.x];
  const int64_t first = l.chunk_first[blockIdx.x];
  return {t, first, min(t->n, first + kChunk)};
}

__global__ void sum_squares_kernel(OptimTensors l, double* parts) {
  const Chunk c = chunk_of(l);
  const double total = chunk_squares(c.t->grad, c.t->grad_dt, c.first, c.end);
  if (threadIdx.x == 0) parts[blockIdx.x] = total;
}

// Block k: totals[k] = the sum of tensor k's chunks' parts.
__global__ void tensor_sums_kernel(const double* parts, const int64_t* first_chunk,
                                   double* totals) {
  const int64_t first = first_chunk[blockIdx.x];
  const double total = ordered_sum(parts + first, first_chunk[blockIdx.x + 1] - first);
  if (threadIdx.x == 0) totals[blockIdx.x] = total;
}

__global__ void adamw_kernel(OptimTensors l, AdamWUpdate u) {
  const Chunk c = chunk_of(l);
  const OptimTensor& t = *c.t;
  const float shrink = t.decay ? u.shrink : 1.0f, gs = u.grad_scale;
  const bool write_param = t.param != t.master;
  for (int64_t i = c.first + threadIdx.x; i < c.end; i += kThreads) {
    const float g = load(t.grad, t.grad_dt, i) * gs;
    const float p = t.master[i] * shrink;
    const float mi = u.beta1 * t.m[i] + (1.0f - u.beta1) * g;
    const float vi = u.beta2 * t.v[i] + (1.0f - u.beta2) * g * g;
    t.m[i] = mi;
    t.v[i] = vi;
    const float next = p - u.step_size * mi / (sqrtf(vi) / u.bc2_sqrt + u.eps);
    t.master[i] = next;
    if (write_param) store(t.param, t.param_dt, i, next);
  }
}

int64_t chunks_of(const std::vector<OptimTensor>& tensors) {
  int64_t chunks = 0;
  for (const OptimTensor& t : tensors) chunks += (t.n + kChunk - 1) / kChunk;
  return chunks;
}

// Where describe() puts the descriptors, the chunk -> tensor table and the chunk -> first
// element table (each 16-byte aligned), and their bytes.
struct Described {
  int64_t owner_at, first_at, bytes;
};
Described described(const std::vector<OptimTensor>& tensors) {
  auto up16 = [](int64_t b) { return (b + 15) / 16 * 16; };
  const int64_t chunks = chunks_of(tensors);
  Described d;
  d.owner_at = up16(static_cast<int64_t>(tensors.size() * sizeof(OptimTensor)));
  d.first_at = d.owner_at + up16(chunks * 4);
  d.bytes = d.first_at + chunks * 8;
  return d;
}
// One tensor's flat passes (CudaBackend's sum_squares, scale, accumulate, adamw): a grid of
// blocks striding over the elements.
__global__ void chunk_squares_kernel(const void* x, DType dt, int64_t n, double* parts) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kChunk;
  const double total = chunk_squares(x, dt, first, min(n, first + kChunk));
  if (threadIdx.x == 0) parts[blockIdx.x] = total;
}

__global__ void sum_parts_kernel(const double* parts, int64_t count, double* total) {
  const double t = ordered_sum(parts, count);
  if (threadIdx.x == 0) *total = t;
}

__global__ void scale_kernel(float* x, int64_t n, float c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    x[i] *= c;
}

__global__ void accumulate_kernel(float* dst, const void* src, DType dt, int64_t n, bool first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    dst[i] = first ? load(src, dt, i) : dst[i] + load(src, dt, i);
}

__global__ void adamw_one_kernel(AdamWUpdate u, float* param, const void* grad, DType dt, float* m,
                                 float* v, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float g = load(grad, dt, i) * u.grad_scale;
    const float p = param[i] * u.shrink;
    const float mi = u.beta1 * m[i] + (1.0f - u.beta1) * g;
    const float vi = u.beta2 * v[i] + (1.0f - u.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = p - u.step_size * mi / (sqrtf(vi) / u.bc2_sqrt + u.eps);
  }
}

unsigned strided_blocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65536));
}

}  // namespace

int64_t describe_bytes(const std::vector<OptimTensor>& tensors) { return described(tensors).bytes; }

OptimTensors describe(const std::vector<OptimTensor>& tensors, void* device) {
  std::vector<int32_t> owner;
  std::vector<int64_t> first;
  for (size_t k = 0; k < tensors.size(); ++k)
    for (int64_t f = 0; f < tensors[k].n; f += kChunk) {
      owner.push_back(static_cast<int32_t>(k));
      first.push_back(f);
    }
  const Described d = described(tensors);
  char* p = static_cast<char*>(device);
  // Synchronous copies: the host vectors go out of scope, and this runs once, before a step.
  TS_CUDA(
      cudaMemcpy(p, tensors.data(), tensors.size() * sizeof(OptimTensor), cudaMemcpyHostToDevice));
  TS_CUDA(cudaMemcpy(p + d.owner_at, owner.data(), owner.size() * 4, cudaMemcpyHostToDevice));
  TS_CUDA(cudaMemcpy(p + d.first_at, first.data(), first.size() * 8, cudaMemcpyHostToDevice));
  OptimTensors l;
  l.tensors = reinterpret_cast<const OptimTensor*>(p);
  l.chunk_tensor = reinterpret_cast<const int32_t*>(p + d.owner_at);
  l.chunk_first = reinterpret_cast<const int64_t*>(p + d.first_at);
  l.chunks = static_cast<int64_t>(owner.size());
  return l;
}

void sum_squares(const OptimTensors& list, double* parts, cudaStream_t stream) {
  if (list.chunks == 0) return;
  sum_squares_kernel<<<static_cast<unsigned>(list.chunks), kThreads, 0, stream>>>(list, parts);
  TS_CUDA_LAUNCH();
}

void tensor_sums(const double* parts, const int64_t* first_chunk, int64_t count, double* totals,
                 cudaStream_t stream) {
  if (count == 0) return;
  tensor_sums_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(parts, first_chunk,
                                                                            totals);
  TS_CUDA_LAUNCH();
}

double sum_squares(const void* x, DType dt, int64_t n, cudaStream_t stream) {
  if (n == 0) return 0;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  double* parts = nullptr;  // the chunks' sums, then the total at parts[chunks]
  TS_CUDA(cudaMallocAsync(&parts, static_cast<size_t>(chunks + 1) * sizeof(double), stream));
  chunk_squares_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(x, dt, n, parts);
  TS_CUDA_LAUNCH();
  sum_parts_kernel<<<1, kThreads, 0, stream>>>(parts, chunks, parts + chunks);
  TS_CUDA_LAUNCH();
  double total = 0;
  TS_CUDA(cudaMemcpyAsync(&total, parts + chunks, sizeof(double), cudaMemcpyDeviceToHost, stream));
  TS_CUDA(cudaFreeAsync(parts, stream));
  TS_CUDA(cudaStreamSynchronize(stream));
  return total;
}

void scale(float* x, int64_t n, float c, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<strided_blocks(n), kThreads, 0, stream>>>(x, n, c);
  TS_CUDA_LAUNCH();
}

void accumulate(float* dst, const void* src, DType dt, int64_t n, bool first, cudaStream_t stream) {
  if (n == 0) return;
  accumulate_kernel<<<strided_blocks(n), kThreads, 0, stream>>>(dst, src, dt, n, first);
  TS_CUDA_LAUNCH();
}

void adamw(const AdamWUpdate& u, float* param, const void* grad, DType dt, float* m, float* v,
           int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  adamw_one_kernel<<<strided_blocks(n), kThreads, 0, stream>>>(u, param, grad, dt, m, v, n);
  TS_CUDA_LAUNCH();
}

void adamw(const OptimTensors& list, const AdamWUpdate& u, cudaStream_t stream) {
  if (list.chunks == 0) return;
  adamw_kernel<<<static_cast<unsigned>(list.chunks), kThreads, 0, stream>>>(list, u);
  TS_CUDA_LAUNCH();
}

}  // namespace tessera::cuda
