#include "ir/shape.h"

#include <algorithm>

namespace tessera {

Shape Shape::with_dim(int i, int64_t size) const {
  std::vector<int64_t> d = dims_;
  d[static_cast<size_t>(axis(i))] = size;
  return Shape(std::move(d));
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

std::string TensorType::to_string() const {
  return std::string(dtype_name(dtype)) + shape.to_string();
}

bool broadcast_shapes(const Shape& a, const Shape& b, Shape* out) {
  int r = std::max(a.rank(), b.rank());
  std::vector<int64_t> d(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) {
    int ia = a.rank() - r + i, ib = b.rank() - r + i;
    int64_t da = ia >= 0 ? a.dim(ia) : 1, db = ib >= 0 ? b.dim(ib) : 1;
    if (da != db && da != 1 && db != 1) return false;
    d[static_cast<size_t>(i)] = da == 1 ? db : da;
  }
  *out = Shape(std::move(d));
  return true;
}

}  // namespace tessera
