// Where a buffer lives: host memory (any code may read it in place), a device's memory (only
// its backend's copies and kernels, or a device communicator, touch it) or nowhere
// (NullBackend: addresses that must not be read). Backends and communicators both say which
// memory their buffers are in; the runtime stages a value through the host where they differ.
#pragma once

#include <cstdint>

namespace tessera {

enum class MemSpace : uint8_t { host, device, none };

}  // namespace tessera
