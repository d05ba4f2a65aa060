// Element types. Storage may be bf16/f16; CPU kernels compute in f32.
//
//   DType t = DType::bf16;  dtype_size(t) == 2;  dtype_name(t) == "bf16"
//   uint16_t h = f32_to_bf16(1.5f);  bf16_to_f32(h) == 1.5f
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace tessera {

enum class DType : uint8_t { f32, bf16, f16, i32 };

inline int64_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
  }
  return "?";
}

inline bool dtype_is_float(DType t) { return t != DType::i32; }
// bf16 or f16: stored in 16 bits, computed in f32 (master weights, accumulators).
inline bool is_low_precision(DType t) { return t == DType::bf16 || t == DType::f16; }

// Accepts "f32"/"fp32"/"float32", "bf16"/"bfloat16", "f16"/"fp16"/"float16", "i32"/"int32"
// (every command's --precision and --dtype take either spelling).
std::optional<DType> parse_dtype(std::string_view name);

// bf16: the high half of an f32, rounded to nearest even (NaN stays NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 (round to nearest even; overflow to inf).
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

}  // namespace tessera
