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

namespace {

// The passes tensor by tensor, through the backend's single-tensor passes.
class EachTensor final : public OptimizerGroup {
 public:
  EachTensor(Backend& b, std::vector<OptimizerTensor> tensors) : b_(b), t_(std::move(tensors)) {}
  std::vector<double> sum_squares() override {
    std::vector<double> out;
    out.reserve(t_.size());
    for (const OptimizerTensor& t : t_) out.push_back(b_.sum_squares(t.grad, t.grad_dtype, t.n));
    return out;
  }
  void adamw(const AdamWUpdate& u) override {
    for (const OptimizerTensor& t : t_) {
      AdamWUpdate ut = u;
      if (!t.decay) ut.shrink = 1.0f;
      b_.adamw(ut, t.master, t.grad, t.grad_dtype, t.m, t.v, t.n);
      if (t.working != nullptr) b_.convert(t.master, DType::f32, t.working, t.working_dtype, t.n);
    }
  }

 private:
  Backend& b_;
  std::vector<OptimizerTensor> t_;
};

}  // namespace

std::unique_ptr<OptimizerGroup> Backend::optimizer_group(std::vector<OptimizerTensor> tensors) {
  return std::make_unique<EachTensor>(*this, std::move(tensors));
}

}  // namespace tessera
