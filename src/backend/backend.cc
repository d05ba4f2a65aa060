#include "backend/backend.h"

#include <chrono>
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

// Marks on the host clock.
class HostClockTimer final : public WorkTimer {
 public:
  void mark() override { marks_.push_back(std::chrono::steady_clock::now()); }
  std::vector<double> intervals() override {
    std::vector<double> out;
    for (size_t i = 1; i < marks_.size(); ++i)
      out.push_back(std::chrono::duration<double>(marks_[i] - marks_[i - 1]).count());
    marks_.clear();
    return out;
  }

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

}  // namespace

std::unique_ptr<WorkTimer> Backend::work_timer() { return std::make_unique<HostClockTimer>(); }

std::unique_ptr<OptimizerGroup> Backend::optimizer_group(std::vector<OptimizerTensor> tensors) {
  return std::make_unique<EachTensor>(*this, std::move(tensors));
}

}  // namespace tessera
