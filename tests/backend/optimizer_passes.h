// The optimizer's passes of a Backend (sum_squares, scale, accumulate, adamw, convert) against
// loops on the host, on random data copied into the backend's memory: f32 and bf16/f16
// gradients, sizes that are not multiples of any chunk. Used for the CPU backend here and the
// CUDA backend where a device is present.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

namespace tessera::testing_passes {

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(gen);
  return v;
}

// A backend buffer holding `host` (f32) stored as dt; `rounded` gets the values it holds.
inline Buffer upload(Backend& b, const std::vector<float>& host, DType dt,
                     std::vector<float>* rounded = nullptr) {
  const int64_t n = static_cast<int64_t>(host.size());
  std::vector<uint8_t> stored(static_cast<size_t>(n * dtype_size(dt)));
  convert_elements(host.data(), DType::f32, stored.data(), dt, n);
  if (rounded) {
    rounded->resize(host.size());
    convert_elements(stored.data(), dt, rounded->data(), DType::f32, n);
  }
  Buffer buf = b.allocate(static_cast<int64_t>(stored.size()));
  b.to_device(buf.data(), stored.data(), static_cast<int64_t>(stored.size()));
  return buf;
}

inline std::vector<float> download(Backend& b, const Buffer& buf, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  b.to_host(out.data(), buf.data(), n * 4);
  return out;
}

// |got - want| <= rel * max(1, |want|) for every element.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                         const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(got[i] - want[i]), rel * std::max(1.0f, std::fabs(want[i])))
        << what << " element " << i;
}

inline void check_optimizer_passes(Backend& b, double rel) {
  for (DType gdt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(gdt));
    const int64_t n = 70001;  // > one 64 Ki widening chunk, not a multiple of 8 Ki
    std::vector<float> g;     // the gradient as stored
    Buffer gb = upload(b, random_floats(n, 1), gdt, &g);

    double sq = 0;
    for (float x : g) sq += static_cast<double>(x) * x;
    EXPECT_NEAR(b.sum_squares(gb.data(), gdt, n), sq, 1e-9 * sq) << "sum_squares";

    std::vector<float> acc0 = random_floats(n, 2);
    Buffer acc = upload(b, acc0, DType::f32);
    b.accumulate(static_cast<float*>(acc.data()), gb.data(), gdt, n, /*first=*/true);
    expect_close(download(b, acc, n), g, 0, "accumulate first");
    b.accumulate(static_cast<float*>(acc.data()), gb.data(), gdt, n, /*first=*/false);
    std::vector<float> twice(g.size());
    for (size_t i = 0; i < g.size(); ++i) twice[i] = g[i] + g[i];
    expect_close(download(b, acc, n), twice, 0, "accumulate");
    b.scale(static_cast<float*>(acc.data()), n, 0.25f);
    for (float& x : twice) x *= 0.25f;
    expect_close(download(b, acc, n), twice, 0, "scale");

    std::vector<float> p = random_floats(n, 3), m = random_floats(n, 4, -0.1f, 0.1f),
                       v = random_floats(n, 5, 0.0f, 0.01f);
    Buffer pb = upload(b, p, DType::f32), mb = upload(b, m, DType::f32),
           vb = upload(b, v, DType::f32);
    AdamWUpdate u;
    u.grad_scale = 0.5f;
    u.shrink = 1.0f - 1e-3f * 0.1f;
    u.step_size = 1e-3f / (1.0f - 0.9f * 0.9f);
    u.bc2_sqrt = std::sqrt(1.0f - 0.95f * 0.95f);
    b.adamw(u, static_cast<float*>(pb.data()), gb.data(), gdt, static_cast<float*>(mb.data()),
            static_cast<float*>(vb.data()), n);
    for (size_t i = 0; i < p.size(); ++i) {
      const float gi = g[i] * u.grad_scale;
      m[i] = u.beta1 * m[i] + (1 - u.beta1) * gi;
      v[i] = u.beta2 * v[i] + (1 - u.beta2) * gi * gi;
      p[i] = p[i] * u.shrink - u.step_size * m[i] / (std::sqrt(v[i]) / u.bc2_sqrt + u.eps);
    }
    expect_close(download(b, pb, n), p, rel, "adamw parameters");
    expect_close(download(b, mb, n), m, rel, "adamw m");
    expect_close(download(b, vb, n), v, rel, "adamw v");

    // convert: f32 master weights into a working copy of the gradient's dtype, and back.
    Buffer low = b.allocate(n * static_cast<int64_t>(dtype_size(gdt)));
    b.convert(pb.data(), DType::f32, low.data(), gdt, n);
    Buffer wide = b.allocate(n * 4);
    b.convert(low.data(), gdt, wide.data(), DType::f32, n);
    std::vector<float> rounded;  // the backend's parameters rounded on the host
    upload(b, download(b, pb, n), gdt, &rounded);
    expect_close(download(b, wide, n), rounded, 0, "convert");
  }
}

// Backend::optimizer_group against the single-tensor passes on copies of the same state: three
// tensors (f32 gradient into f32 weights; bf16 and f16 gradients with a working copy, one
// without weight decay), sizes of one element, exactly one 8 Ki chunk and several chunks.
// The sums must equal sum_squares bit for bit; the updates agree within rel.
inline void check_optimizer_group(Backend& b, double rel) {
  struct Case {
    int64_t n;
    DType grad_dt, working_dt;
    bool decay;
  };
  const std::vector<Case> cases = {{70001, DType::f32, DType::f32, true},
                                   {8192, DType::bf16, DType::bf16, true},
                                   {1, DType::f16, DType::f16, false}};
  struct State {
    Buffer grad, master, m, v, working;
  };
  auto make = [&](const Case& c, uint32_t seed) {
    State st;
    st.grad = upload(b, random_floats(c.n, seed), c.grad_dt);
    st.master = upload(b, random_floats(c.n, seed + 1), DType::f32);
    st.m = upload(b, random_floats(c.n, seed + 2, -0.1f, 0.1f), DType::f32);
    st.v = upload(b, random_floats(c.n, seed + 3, 0.0f, 0.01f), DType::f32);
    if (c.working_dt != DType::f32) st.working = b.allocate(c.n * dtype_size(c.working_dt));
    return st;
  };
  std::vector<State> group_state, single_state;
  std::vector<OptimizerTensor> tensors;
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    group_state.push_back(make(c, 10 * static_cast<uint32_t>(k)));
    single_state.push_back(make(c, 10 * static_cast<uint32_t>(k)));
    State& st = group_state.back();
    tensors.push_back({static_cast<float*>(st.master.data()), st.grad.data(), c.grad_dt,
                       static_cast<float*>(st.m.data()), static_cast<float*>(st.v.data()), c.n,
                       c.decay, st.working.data(), c.working_dt});
  }
  std::unique_ptr<OptimizerGroup> group = b.optimizer_group(tensors);
  const std::vector<double> sums = group->sum_squares();
  ASSERT_EQ(sums.size(), cases.size());
  for (size_t k = 0; k < cases.size(); ++k)
    EXPECT_EQ(sums[k], b.sum_squares(single_state[k].grad.data(), cases[k].grad_dt, cases[k].n))
        << "tensor " << k;

  AdamWUpdate u;
  u.grad_scale = 0.75f;
  u.shrink = 1.0f - 1e-3f * 0.1f;
  u.step_size = 1e-3f / (1.0f - 0.9f);
  u.bc2_sqrt = std::sqrt(1.0f - 0.95f);
  for (int step = 0; step < 2; ++step) {
    group->adamw(u);
    for (size_t k = 0; k < cases.size(); ++k) {
      State& st = single_state[k];
      AdamWUpdate uk = u;
      if (!cases[k].decay) uk.shrink = 1.0f;
      b.adamw(uk, static_cast<float*>(st.master.data()), st.grad.data(), cases[k].grad_dt,
              static_cast<float*>(st.m.data()), static_cast<float*>(st.v.data()), cases[k].n);
      if (st.working)
        b.convert(st.master.data(), DType::f32, st.working.data(), cases[k].working_dt, cases[k].n);
    }
  }
  auto widened = [&](const Buffer& buf, DType dt, int64_t n) {
    Buffer wide = b.allocate(n * 4);
    b.convert(buf.data(), dt, wide.data(), DType::f32, n);
    return download(b, wide, n);
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE("tensor " + std::to_string(k));
    const int64_t n = cases[k].n;
    const State &g = group_state[k], &s1 = single_state[k];
    expect_close(download(b, g.master, n), download(b, s1.master, n), rel, "master weights");
    expect_close(download(b, g.m, n), download(b, s1.m, n), rel, "m");
    expect_close(download(b, g.v, n), download(b, s1.v, n), rel, "v");
    if (g.working) {  // one rounding of nearly equal weights: within a bf16/f16 ulp
      const double ulp = cases[k].working_dt == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
      expect_close(widened(g.working, cases[k].working_dt, n),
                   widened(s1.working, cases[k].working_dt, n), rel == 0 ? 0 : ulp, "working copy");
    }
  }
}

}  // namespace tessera::testing_passes
