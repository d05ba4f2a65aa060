// The op-consistency entries of the mixture-of-experts routing ops (ir/ops_moe.cc): forward
// entries against loops written here, gradient entries against finite differences.
#include <algorithm>
#include <numeric>
#include <random>

#include "op_entries.h"

namespace tessera::op_test {

namespace {

constexpr int64_t kN = 5, kK = 2, kE = 3, kD = 4, kCap = 2;

// Routes of 5 tokens to 2 of 3 experts with 2 slots each: expert 0 is asked by four routes, so
// its last two are dropped (-1); slots as moe_slots assigns them (first choices first).
const std::vector<int32_t> kChoices = {0, 1, 2, 0, 0, 2, 1, 0, 0, 1};
const std::vector<int32_t> kSlots = {0, 3, 4, -1, 1, 5, 2, -1, -1, -1};

// Distinct values 0.25 apart, shuffled: top_k's order is the same for every perturbation a
// finite difference makes.
std::vector<float> spaced(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0f);
  for (float& x : v) x = 0.25f * x - 1.0f;
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return v;
}

}  // namespace

void add_moe_entries(std::vector<Entry>* entries) {
  std::vector<Entry>& e = *entries;
  auto fwd = [&](const char* op, const char* label, std::function<void(Net&)> f) {
    e.push_back(Entry{op, Check::forward, label, std::move(f), nullptr});
  };
  auto grad = [&](const char* op, const char* label, std::function<Var(Net&)> f) {
    e.push_back(Entry{op, Check::grad, label, nullptr, std::move(f)});
  };

  fwd("top_k", "top_k_with_ties", [](Net& n) {
    // Row 1 ties at 0.5: the lower index first.
    Var x = n.param_values(Shape{2, 4}, {0.1f, -2.0f, 3.0f, 0.2f, 0.5f, 0.5f, -1.0f, 0.4f});
    std::vector<Var> top = n.b.op<OpKind::top_k>({x}, {.k = 3});
    n.keep(top[0]);
    n.keep(top[1]);
    n.run();
    expect_close(n.read(top[0]), std::vector<double>{3.0, 0.2, 0.1, 0.5, 0.5, 0.4}, kFwdTol,
                 "values");
    expect_close(n.read_ids(top[1]), std::vector<double>{2, 3, 0, 0, 1, 3}, 0.0, "indices");
  });
  fwd("moe_slots", "moe_slots_first_choices_first", [](Net& n) {
    Var choices = n.ids(Shape{kN, kK}, kChoices);
    Var slots = n.keep(n.b.op<OpKind::moe_slots>({choices}, {.experts = kE, .capacity = kCap})[0]);
    n.run();
    expect_close(n.read_ids(slots), std::vector<double>(kSlots.begin(), kSlots.end()), 0.0,
                 "slots");
  });
  fwd("moe_dispatch", "moe_dispatch_weighted", [](Net& n) {
    Var x = n.param(Shape{kN, kD});
    Var w = n.param(Shape{kN, kK});
    Var slots = n.ids(Shape{kN, kK}, kSlots);
    Var buf =
        n.keep(n.b.op<OpKind::moe_dispatch>({x, slots, w}, {.experts = kE, .capacity = kCap})[0]);
    EXPECT_EQ(buf.shape(), (Shape{kE, kCap, kD}));
    n.run();
    std::vector<double> want(static_cast<size_t>(kE * kCap * kD), 0.0);
    for (size_t r = 0; r < kSlots.size(); ++r)
      for (size_t i = 0; kSlots[r] >= 0 && i < kD; ++i)
        want[static_cast<size_t>(kSlots[r]) * kD + i] = n.host(w)[r] * n.host(x)[r / kK * kD + i];
    expect_close(n.read(buf), want, kFwdTol, "moe_dispatch");
  });
  fwd("moe_combine", "moe_combine_skips_dropped", [](Net& n) {
    Var y = n.param(Shape{kE, kCap, kD});
    Var w = n.param(Shape{kN, kK});
    Var slots = n.ids(Shape{kN, kK}, kSlots);
    Var out =
        n.keep(n.b.op<OpKind::moe_combine>({y, slots, w}, {.experts = kE, .capacity = kCap})[0]);
    n.run();
    std::vector<double> want(static_cast<size_t>(kN * kD), 0.0);
    for (size_t r = 0; r < kSlots.size(); ++r)
      for (size_t i = 0; kSlots[r] >= 0 && i < kD; ++i)
        want[r / kK * kD + i] += n.host(w)[r] * n.host(y)[static_cast<size_t>(kSlots[r]) * kD + i];
    expect_close(n.read(out), want, kFwdTol, "moe_combine");
  });

  grad("top_k", "top_k", [](Net& n) {
    return n.b.op<OpKind::top_k>({n.param_values(Shape{3, 4}, spaced(12, 3))}, {.k = 2})[0];
  });
  grad("moe_dispatch", "moe_dispatch_weighted", [](Net& n) {
    return n.b.op<OpKind::moe_dispatch>(
        {n.param(Shape{kN, kD}), n.ids(Shape{kN, kK}, kSlots), n.param(Shape{kN, kK})},
        {.experts = kE, .capacity = kCap})[0];
  });
  grad("moe_dispatch", "moe_dispatch_unweighted",
       [](Net& n) {  // its gradient: an unweighted combine
         return n.b.op<OpKind::moe_dispatch>({n.param(Shape{kN, kD}), n.ids(Shape{kN, kK}, kSlots)},
                                             {.experts = kE, .capacity = kCap})[0];
       });
  grad("moe_combine", "moe_combine", [](Net& n) {
    return n.b.op<OpKind::moe_combine>(
        {n.param(Shape{kE, kCap, kD}), n.ids(Shape{kN, kK}, kSlots), n.param(Shape{kN, kK})},
        {.experts = kE, .capacity = kCap})[0];
  });
}

}  // namespace tessera::op_test
