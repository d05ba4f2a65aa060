// exp and tanh written so that GCC vectorizes loops over them (no libm calls, no branches):
// Cephes' single-precision exp (range reduction by ln 2, degree-6 polynomial, exponent bits),
// within 2 ulp of std::exp on [-87, 88.7]; 0 below -87.3, +inf above 88.7, NaN for NaN.
//
//   for (int64_t j = 0; j < n; ++j) y[j] = exp_fast(x[j] - m);   // vectorized
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace tessera::cpu {

inline float exp_fast(float x) {
  const float hi = 88.7228f, lo = -87.3365f;
  float xc = x > hi ? hi : (x < lo ? lo : x);
  xc = xc != xc ? 0.0f : xc;  // NaN: computed on 0 (a NaN-to-int conversion is undefined), then
                              // returned as NaN below
  // n = round(xc / ln 2) by the 1.5 * 2^23 trick (std::floor does not vectorize by default).
  const float magic = 12582912.0f;
  float n = (xc * 1.44269504088896341f + magic) - magic;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n from the exponent bits; n = 128 (x in (88.38, 88.72]) would be the infinity pattern,
  // so it is applied as 2^127 * 2.
  float top = n > 127.0f ? 1.0f : 0.0f;
  float scale = std::bit_cast<float>((static_cast<int32_t>(n - top) + 127) << 23);
  float y = p * scale * (1.0f + top);
  y = x < lo ? 0.0f : y;
  y = x > hi ? INFINITY : y;
  return x != x ? x : y;
}

// tanh(u) = 1 - 2 / (exp(2u) + 1): absolute error below 2e-7, saturating at +-1.
inline float tanh_fast(float u) {
  float e = exp_fast(2.0f * (u > 44.0f ? 44.0f : u));
  return 1.0f - 2.0f / (e + 1.0f);
}

inline constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)

// GELU, tanh approximation (as GPT-2 and torch's approximate="tanh").
inline float gelu_fast(float x) {
  float u = kGeluC * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanh_fast(u));
}

// d gelu(x) / dx.
inline float gelu_grad_fast(float x) {
  float u = kGeluC * (x + 0.044715f * x * x * x);
  float t = tanh_fast(u);
  float du = kGeluC * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

}  // namespace tessera::cpu
