// Tensor shapes: a list of dimension sizes, rank 0 for scalars.
//
//   Shape s{2, 16, 64};  s.rank() == 3;  s.numel() == 2048;  s.to_string() == "[2,16,64]"
//   Shape t = s.with_dim(-1, 128);  // [2,16,128]
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "ir/dtype.h"

namespace tessera {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims_) n *= d;
    return n;
  }
  // Negative indices count from the end: dim(-1) is the last dimension.
  int64_t dim(int i) const { return dims_[static_cast<size_t>(i < 0 ? i + rank() : i)]; }
  int64_t operator[](int i) const { return dim(i); }
  const std::vector<int64_t>& dims() const { return dims_; }
  Shape with_dim(int i, int64_t size) const;
  // Elements of the dims before / after `axis` (a normalized axis): the outer and inner
  // extents of a copy along that axis.
  int64_t numel_before(int axis) const {
    int64_t n = 1;
    for (int d = 0; d < axis; ++d) n *= dims_[static_cast<size_t>(d)];
    return n;
  }
  int64_t numel_after(int axis) const {
    int64_t n = 1;
    for (int d = axis + 1; d < rank(); ++d) n *= dims_[static_cast<size_t>(d)];
    return n;
  }
  // Normalizes a possibly negative axis; returns -1 when out of range.
  int axis(int i) const { return (i < -rank() || i >= rank()) ? -1 : (i < 0 ? i + rank() : i); }
  std::string to_string() const;
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }

 private:
  std::vector<int64_t> dims_;
};

// A value's type: shape and element type.
struct TensorType {
  Shape shape;
  DType dtype = DType::f32;
  int64_t bytes() const { return shape.numel() * dtype_size(dtype); }
  std::string to_string() const;
};

// Numpy-style broadcast of two shapes (trailing dimensions aligned). Returns false if they do
// not broadcast.
bool broadcast_shapes(const Shape& a, const Shape& b, Shape* out);

}  // namespace tessera
