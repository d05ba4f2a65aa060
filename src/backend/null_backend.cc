#include "backend/null_backend.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"

namespace tessera {

void* NullBackend::alloc(int64_t bytes) {
  TS_CHECK_GE(bytes, 0) << "negative allocation";
  const uintptr_t at = next_;
  // 4 KiB apart, with a gap page, so that two buffers never share an address.
  next_ += (static_cast<uintptr_t>(std::max<int64_t>(bytes, 1)) + 8191) / 4096 * 4096;
  live_[at] = bytes;
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  return reinterpret_cast<void*>(at);
}

void NullBackend::free(void* p) {
  auto it = live_.find(reinterpret_cast<uintptr_t>(p));
  TS_CHECK(it != live_.end()) << "freeing an address the NULL backend did not hand out";
  in_use_ -= it->second;
  live_.erase(it);
}

void NullBackend::to_host(void* host_dst, const void*, int64_t bytes) {
  std::memset(host_dst, 0, static_cast<size_t>(bytes));
}

}  // namespace tessera
