// T5's relative position buckets (Raffel et al. 2020; the definition of Mesh TensorFlow and
// Hugging Face's T5Attention._relative_position_bucket): the bucket of key j seen from query
// i. Offsets below max_exact get a bucket each; longer ones share logarithmically wider
// buckets up to max_distance, beyond which all fall in the last. Bidirectional (encoders)
// gives keys after the query the upper half of the buckets; unidirectional (decoders) maps
// every later key to bucket 0. Shared by the position_buckets kernels (CPU and CUDA).
#pragma once

#include <cmath>
#include <cstdint>

#include "base/host_device.h"

namespace tessera {

TS_HOST_DEVICE inline int32_t t5_position_bucket(int64_t i, int64_t j, bool bidirectional,
                                                 int64_t num_buckets, int64_t max_distance) {
  const int64_t rel = j - i;
  int64_t bucket = 0, n = 0;
  if (bidirectional) {
    num_buckets /= 2;
    if (rel > 0) bucket += num_buckets;
    n = rel < 0 ? -rel : rel;
  } else {
    n = rel < 0 ? -rel : 0;
  }
  const int64_t max_exact = num_buckets / 2;
  if (n < max_exact) return static_cast<int32_t>(bucket + n);
  // In f32, as the reference computes it (a float tensor's log over a scalar's).
  const float wide =
      logf(static_cast<float>(n) / static_cast<float>(max_exact)) /
      static_cast<float>(log(static_cast<double>(max_distance) / static_cast<double>(max_exact))) *
      static_cast<float>(num_buckets - max_exact);
  int64_t large = max_exact + static_cast<int64_t>(wide);
  if (large > num_buckets - 1) large = num_buckets - 1;
  return static_cast<int32_t>(bucket + large);
}

}  // namespace tessera
