// The storage types of the CUDA kernels (f32, bf16, f16) on the device and their dispatch on
// the host: kernels templated on the element type T read as_f32(x[i]) and write
// from_f32<T>(v), computing in f32 (one rounding of each result).
//
//   with_storage(a.out_types[0].dtype, [&](auto* tag) {
//     using T = std::remove_pointer_t<decltype(tag)>;
//     my_kernel<T><<<...>>>(static_cast<const T*>(a.in[0]), static_cast<T*>(a.out[0]));
//   });
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>

#include "backend/cuda/kernels.h"

namespace tessera::cuda {

__device__ inline float as_f32(float x) { return x; }
__device__ inline float as_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float as_f32(__half x) { return __half2float(x); }

template <typename T>
__device__ inline T from_f32(float x);
template <>
__device__ inline float from_f32<float>(float x) {
  return x;
}
template <>
__device__ inline __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ inline __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}

// 16 bytes of elements (8 bf16/f16, 4 f32): where every operand is 16-byte aligned and the
// element counts divide, the kernels move whole packs (one 16-byte load per operand).
template <typename T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

template <typename T>
bool packs_fit(int64_t n, std::initializer_list<const void*> ptrs) {
  bool ok = n % Pack<T>::kN == 0;
  for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  return ok;
}

// Calls f with a null pointer of the element type that stores dt (f32, bf16, f16).
template <typename F>
void with_storage(DType dt, F f) {
  switch (dt) {
    case DType::bf16:
      return f(static_cast<__nv_bfloat16*>(nullptr));
    case DType::f16:
      return f(static_cast<__half*>(nullptr));
    default:
      return f(static_cast<float*>(nullptr));
  }
}

// Whether a kernel templated on one storage type takes the op as stored: the inputs `ins` and
// outputs `outs` (not both empty) share one dtype and every other operand is f32 or i32. Where not,
// the kernel runs on widened copies (run_in_f32).
inline bool one_storage(const Args& a, std::initializer_list<int> ins,
                        std::initializer_list<int> outs) {
  const DType t = ins.size() > 0 ? a.in_types[static_cast<size_t>(*ins.begin())].dtype
                                 : a.out_types[static_cast<size_t>(*outs.begin())].dtype;
  auto member = [](std::initializer_list<int> l, size_t i) {
    for (int x : l)
      if (static_cast<size_t>(x) == i) return true;
    return false;
  };
  auto ok = [&](std::span<const TensorType> types, std::initializer_list<int> mine) {
    for (size_t i = 0; i < types.size(); ++i) {
      const DType d = types[i].dtype;
      if (member(mine, i) ? d != t : d != DType::f32 && d != DType::i32) return false;
    }
    return true;
  };
  return ok(a.in_types, ins) && ok(a.out_types, outs);
}

}  // namespace tessera::cuda
