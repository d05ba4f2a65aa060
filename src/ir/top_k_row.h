// top_k of one row: the k largest of n values in decreasing order, ties to the lower index (k
// passes over the row: k is small, a mixture's experts per token). Shared by the top_k
// kernels (CPU and CUDA).
#pragma once

#include <cstdint>

#include "base/host_device.h"

namespace tessera {

TS_HOST_DEVICE inline void top_k_row(const float* row, int64_t n, int64_t k, float* values,
                                     int32_t* idx) {
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < n; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
      if (!taken && (best < 0 || row[e] > row[best])) best = e;
    }
    idx[j] = static_cast<int32_t>(best);
    values[j] = row[best];
  }
}

}  // namespace tessera
