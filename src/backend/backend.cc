#include "backend/backend.h"

#include <utility>

namespace tessera {

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = std::exchange(o.owner_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void Buffer::reset() {
  if (owner_ != nullptr && data_ != nullptr) owner_->free(data_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

Buffer Backend::allocate(int64_t bytes) { return Buffer(this, alloc(bytes), bytes); }

}  // namespace tessera
