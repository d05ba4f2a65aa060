#include "backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif
#include <new>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "base/check.h"

namespace tessera {

namespace {

float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::i32:
      return static_cast<float>(static_cast<const int32_t*>(p)[i]);
  }
  return 0;
}

void store(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = v;
      return;
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      return;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      return;
    case DType::i32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      return;
  }
}

// Every kernel file's registrations, once.
const cpu::KernelTable& kernels() {
  static const cpu::KernelTable table = [] {
    cpu::KernelTable t;
    cpu::register_elementwise_kernels(t);
    cpu::register_shape_kernels(t);
    cpu::register_matmul_kernels(t);
    cpu::register_nn_kernels(t);
    cpu::register_moe_kernels(t);
    cpu::register_attention_kernels(t);
    return t;
  }();
  return table;
}

// f32 buffers that widen a low-precision kernel's inputs and outputs, kept per thread between
// calls: a fresh allocation per node costs page faults on every byte (5x slower steps).
class WidenPool {
 public:
  float* get(size_t slot, int64_t n) {
    if (bufs_.size() <= slot) bufs_.resize(slot + 1);
    std::vector<float>& b = bufs_[slot];
    if (b.size() < static_cast<size_t>(n)) b.resize(static_cast<size_t>(n));
    return b.data();
  }

 private:
  std::vector<std::vector<float>> bufs_;
};

}  // namespace

void convert_elements(const void* src, DType from, void* dst, DType to, int64_t n) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(n * dtype_size(from)));
    return;
  }
  TS_CHECK(from != DType::i32 && to != DType::i32) << "cannot convert i32 to/from float";
  cpu::parallel_for(n, 16384, [&](int64_t lo, int64_t hi) {
    // bf16 <-> f32, the mixed-precision pair, in loops the compiler vectorizes.
    if (from == DType::bf16 && to == DType::f32) {
      const uint16_t* x = static_cast<const uint16_t*>(src);
      float* y = static_cast<float*>(dst);
      for (int64_t i = lo; i < hi; ++i) y[i] = bf16_to_f32(x[i]);
    } else if (from == DType::f32 && to == DType::bf16) {
      const float* x = static_cast<const float*>(src);
      uint16_t* y = static_cast<uint16_t*>(dst);
      for (int64_t i = lo; i < hi; ++i) y[i] = f32_to_bf16(x[i]);
#if defined(__F16C__)  // the hardware's IEEE conversions (round to nearest even), 8 at a time
    } else if (from == DType::f16 && to == DType::f32) {
      const uint16_t* x = static_cast<const uint16_t*>(src);
      float* y = static_cast<float*>(dst);
      int64_t i = lo;
      for (; i + 8 <= hi; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
      for (; i < hi; ++i) y[i] = _cvtsh_ss(x[i]);
    } else if (from == DType::f32 && to == DType::f16) {
      const float* x = static_cast<const float*>(src);
      uint16_t* y = static_cast<uint16_t*>(dst);
      int64_t i = lo;
      for (; i + 8 <= hi; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
      for (; i < hi; ++i) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
#endif
    } else {
      for (int64_t i = lo; i < hi; ++i) store(dst, to, i, load(src, from, i));
    }
  });
}

// Not kernels: parameters and inputs are bound by the executor, collectives run on a
// Communicator, axis_index is written by the distributed runtime.
bool CpuBackend::supports(OpKind op) const {
  return op == OpKind::cast || kernels().at(op) != nullptr;
}

void CpuBackend::run(const Graph& g, const Node& node, std::span<const void* const> inputs,
                     std::span<void* const> outputs) {
  if (node.op == OpKind::cast) {
    const TensorType& in = g.type(node.inputs[0]);
    convert_elements(inputs[0], in.dtype, outputs[0], g.type(node.outputs[0]).dtype,
                     in.shape.numel());
    return;
  }
  std::vector<TensorType> in_types, out_types;
  for (ValueId v : node.inputs) in_types.push_back(g.type(v));
  for (ValueId v : node.outputs) out_types.push_back(g.type(v));

  // Low-precision storage: widen inputs to f32, run the f32 kernel, narrow the outputs.
  thread_local WidenPool pool;
  size_t slot = 0;
  cpu::Args args{node.attrs, in_types, out_types, {}, {}};
  for (size_t i = 0; i < inputs.size(); ++i) {
    TensorType& t = in_types[i];
    if (is_low_precision(t.dtype)) {
      float* w = pool.get(slot++, t.shape.numel());
      convert_elements(inputs[i], t.dtype, w, DType::f32, t.shape.numel());
      args.in.push_back(w);
      t.dtype = DType::f32;
    } else {
      args.in.push_back(inputs[i]);
    }
  }
  std::vector<std::pair<size_t, float*>> narrowed;
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorType& t = out_types[i];
    if (is_low_precision(t.dtype)) {
      narrowed.emplace_back(i, pool.get(slot++, t.shape.numel()));
      args.out.push_back(narrowed.back().second);
      t.dtype = DType::f32;
    } else {
      args.out.push_back(outputs[i]);
    }
  }
  const cpu::KernelFn fn = kernels().at(node.op);
  TS_CHECK(fn != nullptr) << "the CPU backend has no kernel for " << op_name(node.op)
                          << " (parameters, inputs, collectives and axis_index are not kernels)";
  fn(node.op, args);
  for (auto& [i, buf] : narrowed) {
    const TensorType& t = g.type(node.outputs[i]);
    convert_elements(buf, DType::f32, outputs[i], t.dtype, t.shape.numel());
  }
}

void* CpuBackend::alloc(int64_t bytes) {
  // calloc: large blocks come straight from mmap as zero pages, so memory the run never
  // touches is never committed. At least one byte, so that an empty arena has an address.
  void* p = std::calloc(static_cast<size_t>(std::max<int64_t>(bytes, 1)), 1);
  // As operator new: the caller (the CLI's main) reports it as "error: out of memory".
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void CpuBackend::free(void* p) { std::free(p); }

void CpuBackend::to_device(void* dst, const void* host_src, int64_t bytes) {
  std::memcpy(dst, host_src, static_cast<size_t>(bytes));
}

void CpuBackend::to_host(void* host_dst, const void* src, int64_t bytes) {
  std::memcpy(host_dst, src, static_cast<size_t>(bytes));
}

void CpuBackend::copy(void* dst, const void* src, int64_t bytes) {
  std::memmove(dst, src, static_cast<size_t>(bytes));
}

void CpuBackend::fill(void* dst, uint8_t byte, int64_t bytes) {
  std::memset(dst, byte, static_cast<size_t>(bytes));
}

namespace {

// A bf16/f16 input is read in chunks widened into a buffer of this many floats (f32 needs none).
constexpr int64_t kWidenChunk = int64_t{1} << 16;

// Calls f(offset, f32 pointer, count) over n elements of dtype dt at x, widened chunk by chunk.
template <typename F>
void widened_chunks(const void* x, DType dt, int64_t n, F f) {
  if (dt == DType::f32) return f(0, static_cast<const float*>(x), n);
  std::vector<float> buf(static_cast<size_t>(std::min(n, kWidenChunk)));
  const int64_t width = static_cast<int64_t>(dtype_size(dt));
  for (int64_t at = 0; at < n; at += kWidenChunk) {
    const int64_t k = std::min(kWidenChunk, n - at);
    convert_elements(static_cast<const char*>(x) + at * width, dt, buf.data(), DType::f32, k);
    f(at, buf.data(), k);
  }
}

}  // namespace

double CpuBackend::sum_squares(const void* x, DType dtype, int64_t n) {
  double sum = 0;
  widened_chunks(x, dtype, n,
                 [&](int64_t, const float* g, int64_t k) { sum += cpu::sum_squares(g, k); });
  return sum;
}

void CpuBackend::scale(float* x, int64_t n, float c) { cpu::scale_inplace(x, n, c); }

void CpuBackend::accumulate(float* dst, const void* src, DType src_dtype, int64_t n, bool first) {
  if (src_dtype == DType::f32) {
    if (first) return cpu::copy_floats(dst, static_cast<const float*>(src), n);
    return cpu::add_inplace(dst, static_cast<const float*>(src), n);
  }
  if (first) return convert_elements(src, src_dtype, dst, DType::f32, n);
  widened_chunks(src, src_dtype, n,
                 [&](int64_t at, const float* g, int64_t k) { cpu::add_inplace(dst + at, g, k); });
}

void CpuBackend::adamw(const AdamWUpdate& u, float* param, const void* grad, DType grad_dtype,
                       float* m, float* v, int64_t n) {
  widened_chunks(grad, grad_dtype, n, [&](int64_t at, const float* g, int64_t k) {
    cpu::adamw_update(u, param + at, g, m + at, v + at, k);
  });
}

const char* openblas_better_coretype() {
#if defined(__x86_64__)
  const char* core = openblas_get_corename();
  if (core == nullptr || std::strcmp(core, "Prescott") != 0) return nullptr;
  return __builtin_cpu_supports("avx512f") ? "SkylakeX"
         : __builtin_cpu_supports("avx2")  ? "Haswell"
                                           : nullptr;
#else
  return nullptr;
#endif
}

}  // namespace tessera
