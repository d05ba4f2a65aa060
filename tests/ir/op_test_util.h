// Helpers of the op-consistency harness (op_consistency_test.cc): random inputs, `Net` (a
// graph, its inputs and an executor), naive references and the finite-difference gradient check.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ir/autodiff.h"
#include "ir/builder.h"
#include "runtime/executor.h"

namespace tessera::op_test {

// ---- host-side helpers ---------------------------------------------------------------------

struct Gen {
  float lo = -1.0f, hi = 1.0f;
  bool away_from_zero = false;  // random sign, magnitude in [lo, hi]
};
inline Gen uniform(float lo, float hi) { return Gen{lo, hi, false}; }
inline Gen magnitude(float lo, float hi) { return Gen{lo, hi, true}; }

inline std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(static_cast<size_t>(s.rank()), 1);
  for (int d = s.rank() - 2; d >= 0; --d) st[static_cast<size_t>(d)] = st[d + 1] * s[d + 1];
  return st;
}

inline std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> c(static_cast<size_t>(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    c[static_cast<size_t>(d)] = i % s[d];
    i /= s[d];
  }
  return c;
}

// Element of x (shape xs) read at output coordinate c under numpy broadcasting.
inline double bcast_at(const std::vector<float>& x, const Shape& xs,
                       const std::vector<int64_t>& c) {
  int off = static_cast<int>(c.size()) - xs.rank();
  int64_t idx = 0;
  for (int d = 0; d < xs.rank(); ++d)
    idx = idx * xs[d] + (xs[d] == 1 ? 0 : c[static_cast<size_t>(d + off)]);
  return x[static_cast<size_t>(idx)];
}

// Tensor-wide comparison: max |got - want| <= rtol * max(1, max |want|).
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                         double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double err = 0, scale = 0;
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    // A NaN on either side is an infinite error (and stays the worst).
    double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (std::isnan(e)) e = INFINITY;
    if (e > err) {
      err = e;
      worst = i;
    }
    scale = std::max(scale, std::fabs(want[i]));
  }
  EXPECT_LE(err, rtol * std::max(1.0, scale))
      << what << ": worst element " << worst << " got " << got[worst] << " want " << want[worst];
}
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                         const std::string& what) {
  expect_close(got, std::vector<double>(want.begin(), want.end()), rtol, what);
}

inline constexpr double kFwdTol = 1e-5;

// ---- Net: a graph, its random inputs and an executor --------------------------------------

class Net {
 public:
  explicit Net(uint32_t seed = 7) : rng_(seed) {}
  Graph g;
  Builder b{&g};

  // A float parameter (so autodiff differentiates it) with random values.
  Var param(Shape s, Gen gen = {}, DType dt = DType::f32) {
    std::vector<float> v(static_cast<size_t>(s.numel()));
    std::uniform_real_distribution<float> u(gen.lo, gen.hi);
    std::bernoulli_distribution sign(0.5);
    for (float& x : v) {
      x = u(rng_);
      if (gen.away_from_zero && sign(rng_)) x = -x;
    }
    return param_values(std::move(s), std::move(v), dt);
  }
  Var param_values(Shape s, std::vector<float> v, DType dt = DType::f32) {
    EXPECT_EQ(static_cast<int64_t>(v.size()), s.numel());
    Var p = b.parameter("p" + std::to_string(params_.size()), std::move(s), Init::zeros, 0.0, dt);
    if (dt != DType::f32) {  // the host copy holds exactly what is stored
      std::vector<uint16_t> q(v.size());
      convert_elements(v.data(), DType::f32, q.data(), dt, static_cast<int64_t>(v.size()));
      convert_elements(q.data(), dt, v.data(), DType::f32, static_cast<int64_t>(v.size()));
    }
    params_.push_back(p);
    host_[p.id] = std::move(v);
    return p;
  }
  // A float input with given values (not differentiated).
  Var finput(Shape s, std::vector<float> v) {
    Var x = b.input("f" + std::to_string(inputs_.size()), std::move(s));
    inputs_.push_back(x);
    host_[x.id] = std::move(v);
    return x;
  }
  Var ids(Shape s, std::vector<int32_t> v) {
    EXPECT_EQ(static_cast<int64_t>(v.size()), s.numel());
    Var x = b.input("i" + std::to_string(inputs_.size()), std::move(s), DType::i32);
    inputs_.push_back(x);
    host_ids_[x.id] = std::move(v);
    return x;
  }
  Var random_ids(Shape s, int32_t n) {
    std::vector<int32_t> v(static_cast<size_t>(s.numel()));
    std::uniform_int_distribution<int32_t> u(0, n - 1);
    for (int32_t& x : v) x = u(rng_);
    return ids(std::move(s), std::move(v));
  }
  std::vector<float> random(int64_t n, Gen gen = {}) {
    std::vector<float> v(static_cast<size_t>(n));
    std::uniform_real_distribution<float> u(gen.lo, gen.hi);
    for (float& x : v) x = u(rng_);
    return v;
  }

  const std::vector<float>& host(Var v) const { return host_.at(v.id); }
  const std::vector<int32_t>& host_ids(Var v) const { return host_ids_.at(v.id); }
  const std::vector<Var>& params() const { return params_; }
  // Values read after run() must be graph outputs, or the planner may reuse their bytes.
  Var keep(Var v) {
    g.mark_output(v.id);
    return v;
  }

  Executor& ex() {
    if (!ex_) {
      ex_ = std::make_unique<Executor>(g, cpu_);
      for (Var p : params_) write_param(p);
    }
    return *ex_;
  }
  void write_param(Var p) {
    const std::vector<float>& v = host_.at(p.id);
    convert_elements(v.data(), DType::f32, ex().raw(p.id), p.dtype(),
                     static_cast<int64_t>(v.size()));
  }
  void set_param_element(Var p, size_t i, float value) {
    ASSERT_EQ(p.dtype(), DType::f32);
    ex().data<float>(p.id)[i] = value;
  }
  void run() {
    Executor& e = ex();
    for (Var x : inputs_) {
      if (x.dtype() == DType::i32) {
        e.set_input(g.name_of(x.id), host_ids_.at(x.id).data());
      } else {
        e.set_input(g.name_of(x.id), host_.at(x.id).data());
      }
    }
    e.run();
  }
  std::vector<float> read_ids(Var v) {  // an i32 value (small ids), as floats for expect_close
    const int32_t* p = static_cast<const int32_t*>(ex().raw(v.id));
    return std::vector<float>(p, p + v.shape().numel());
  }
  std::vector<float> read(Var v) {
    std::vector<float> out(static_cast<size_t>(v.shape().numel()));
    convert_elements(ex().raw(v.id), v.dtype(), out.data(), DType::f32, v.shape().numel());
    return out;
  }

 private:
  std::mt19937 rng_;
  CpuBackend cpu_;
  std::unique_ptr<Executor> ex_;
  std::vector<Var> params_, inputs_;
  std::map<ValueId, std::vector<float>> host_;
  std::map<ValueId, std::vector<int32_t>> host_ids_;
};

inline bool has_op(const Graph& g, OpKind k) {
  for (const Node& n : g.nodes())
    if (n.op == k) return true;
  return false;
}

inline std::vector<int64_t> all_axes(const Var& v) {
  std::vector<int64_t> a;
  for (int i = 0; i < v.rank(); ++i) a.push_back(i);
  return a;
}

// ---- naive references ------------------------------------------------------------------------

inline std::vector<double> ref_binary(OpKind op, const std::vector<float>& x, const Shape& xs,
                                      const std::vector<float>& y, const Shape& ys) {
  Shape out;
  EXPECT_TRUE(broadcast_shapes(xs, ys, &out));
  std::vector<double> z(static_cast<size_t>(out.numel()));
  for (int64_t i = 0; i < out.numel(); ++i) {
    std::vector<int64_t> c = unravel(i, out);
    double a = bcast_at(x, xs, c), b = bcast_at(y, ys, c);
    double r = 0;
    switch (op) {
      case OpKind::add:
        r = a + b;
        break;
      case OpKind::sub:
        r = a - b;
        break;
      case OpKind::mul:
        r = a * b;
        break;
      case OpKind::div:
        r = a / b;
        break;
      default:
        ADD_FAILURE() << "not binary";
    }
    z[static_cast<size_t>(i)] = r;
  }
  return z;
}

inline double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
inline double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Sums x over `axes` into the kept shape (reduced dims 1) in row-major order.
inline std::vector<double> ref_reduce(const std::vector<float>& x, const Shape& xs,
                                      const std::vector<int64_t>& axes) {
  Shape kept = xs;
  for (int64_t a : axes) kept = kept.with_dim(static_cast<int>(a), 1);
  std::vector<double> out(static_cast<size_t>(kept.numel()), 0.0);
  std::vector<int64_t> ks = strides_of(kept);
  for (int64_t i = 0; i < xs.numel(); ++i) {
    std::vector<int64_t> c = unravel(i, xs);
    int64_t o = 0;
    for (int d = 0; d < xs.rank(); ++d)
      o += (kept[d] == 1 ? 0 : c[static_cast<size_t>(d)]) * ks[static_cast<size_t>(d)];
    out[static_cast<size_t>(o)] += x[static_cast<size_t>(i)];
  }
  return out;
}

inline std::vector<double> ref_transpose(const std::vector<float>& x, const Shape& xs,
                                         const std::vector<int64_t>& perm) {
  std::vector<int64_t> od;
  for (int64_t p : perm) od.push_back(xs[static_cast<int>(p)]);
  Shape os(od);
  std::vector<int64_t> is = strides_of(xs);
  std::vector<double> y(static_cast<size_t>(os.numel()));
  for (int64_t i = 0; i < os.numel(); ++i) {
    std::vector<int64_t> c = unravel(i, os);
    int64_t off = 0;
    for (size_t d = 0; d < perm.size(); ++d) off += c[d] * is[static_cast<size_t>(perm[d])];
    y[static_cast<size_t>(i)] = x[static_cast<size_t>(off)];
  }
  return y;
}

inline std::vector<double> ref_matmul(const std::vector<float>& A, const Shape& sa,
                                      const std::vector<float>& B, const Shape& sb, bool ta,
                                      bool tb) {
  int64_t M = ta ? sa[-1] : sa[-2], K = ta ? sa[-2] : sa[-1], N = tb ? sb[-2] : sb[-1];
  int64_t batch = sa.numel() / (M * K);
  bool shared = sb.rank() == 2;
  std::vector<double> C(static_cast<size_t>(batch * M * N), 0.0);
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) {
          double a = A[static_cast<size_t>(bi * M * K + (ta ? k * M + m : m * K + k))];
          double b =
              B[static_cast<size_t>((shared ? 0 : bi * K * N) + (tb ? n * K + k : k * N + n))];
          s += a * b;
        }
        C[static_cast<size_t>((bi * M + m) * N + n)] = s;
      }
  return C;
}

// ---- gradient check ----------------------------------------------------------------------

// loss = reduce_sum(out * W) with fixed random W; compares every parameter gradient with
// central differences (f32 graph, step eps) at relative error rtol over the tensor.
inline void grad_check(Net& n, Var out, double eps, double rtol) {
  ASSERT_TRUE(dtype_is_float(out.dtype()));
  Var y = out.dtype() == DType::f32 ? out : n.b.cast(out, DType::f32);
  Var w = n.finput(y.shape(), n.random(y.shape().numel(), uniform(-1.0f, 1.0f)));
  Var loss = n.b.reduce_sum(y * w, all_axes(y));
  append_backward(n.b, loss);
  ASSERT_TRUE(verify(n.g).ok()) << verify(n.g).to_string();
  n.run();
  auto loss_now = [&] {
    n.run();
    return static_cast<double>(n.ex().data<float>(loss.id)[0]);
  };
  ASSERT_TRUE(std::isfinite(loss_now()));
  for (size_t pi = 0; pi < n.params().size(); ++pi) {
    Var p = n.params()[pi];
    if (p.dtype() != DType::f32) continue;
    n.run();
    std::vector<float> ad = n.read(n.b.var(n.g.param_grads().at(p.id)));
    std::vector<double> fd(ad.size());
    for (size_t i = 0; i < ad.size(); ++i) {
      float x0 = n.host(p)[i];
      n.set_param_element(p, i, static_cast<float>(x0 + eps));
      double lp = loss_now();
      n.set_param_element(p, i, static_cast<float>(x0 - eps));
      double lm = loss_now();
      n.set_param_element(p, i, x0);
      fd[i] = (lp - lm) / (2 * eps);
    }
    double err = 0, scale = 0;
    size_t worst = 0;
    for (size_t i = 0; i < ad.size(); ++i) {
      double e = std::fabs(ad[i] - fd[i]);
      if (!(e <= err)) {
        err = e;
        worst = i;
      }
      scale = std::max(scale, std::fabs(fd[i]));
    }
    EXPECT_GT(scale, 1e-3) << "gradient of input " << pi << " is ~0: the check would be vacuous";
    EXPECT_LE(err, rtol * scale) << "gradient of input " << pi << " " << p.shape().to_string()
                                 << ": element " << worst << " autodiff " << ad[worst]
                                 << " finite difference " << fd[worst];
  }
}

}  // namespace tessera::op_test
