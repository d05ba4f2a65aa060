// Tensor layouts and redistribute(): local boxes and errors, the collectives chosen for the
// DESIGN.md table, and every pair of layouts on 1-3 mesh axes executed on a dense reference
// (layout_reference.h), Partials summed and replicas compared.
#include "parallel/redistribute.h"

#include <gtest/gtest.h>

#include "layout_reference.h"

namespace tessera {
namespace {

using namespace testing_layout;

const Placement R = Placement::replicate();
const Placement P = Placement::partial();
Placement S(int d) { return Placement::shard(d); }

std::vector<CommStep::Kind> kinds(const std::vector<CommStep>& steps) {
  std::vector<CommStep::Kind> k;
  for (const CommStep& s : steps) k.push_back(s.kind);
  return k;
}

std::vector<CommStep> plan(const TensorLayout& a, const TensorLayout& b, const Mesh& m) {
  Result<std::vector<CommStep>> r = redistribute(a, b, m);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::vector<CommStep>{};
}

TEST(TensorLayout, TwoAxesOnOneDimSplitInMeshOrder) {
  Mesh m({{"dp", 2}, {"tp", 3}});
  TensorLayout l{Shape{12, 5}, {S(0), S(0)}, {}};
  ASSERT_TRUE(l.check(m).ok());
  EXPECT_EQ(l.local_shape(m).value(), (Shape{2, 5}));
  // Rank 4 is dp 1, tp 1: block 1 * 3 + 1 = 4 of 6.
  EXPECT_EQ(l.local_box(m, 4), (Box{{8, 0}, {10, 5}}));
  EXPECT_EQ(l.shard_axes(m, 0), (std::vector<std::string>{"dp", "tp"}));
  EXPECT_EQ(l.to_string(m), "[12,5] {dp: S(0), tp: S(0)}");
}

TEST(TensorLayout, FlatBlockIsAZeroPaddedPieceOfTheLocalShard) {
  // TP x FSDP: the tp piece [2,5] (10 elements) cut in 4-element blocks over dp (3 ranks).
  Mesh m({{"dp", 3}, {"tp", 2}});
  TensorLayout l{Shape{4, 5}, {R, S(0)}, {"dp"}};
  ASSERT_TRUE(l.check(m).ok()) << l.check(m).to_string();
  EXPECT_EQ(l.flat_block(m, 0), (FlatRange{0, 4, 4}));
  EXPECT_EQ(l.flat_block(m, 5), (FlatRange{8, 2, 4}));  // dp 2, tp 1
  EXPECT_EQ(l.stored_numel(m), 4);
  EXPECT_EQ(l.local_box(m, 5), (Box{{2, 0}, {4, 5}}));
}

TEST(TensorLayout, ErrorsNameTheDimAndTheDegreesThatWork) {
  Mesh m({{"dp", 2}, {"tp", 4}});
  Status s = TensorLayout{Shape{6, 8}, {R, S(0)}, {}}.check(m);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("dim 0 (size 6) cannot be split 4 ways over tp"), std::string::npos)
      << s.message();
  EXPECT_NE(s.hint().find("1, 2, 3, 6"), std::string::npos) << s.hint();
  EXPECT_FALSE(TensorLayout(Shape{8}, {R}, {}).check(m).ok());        // one placement short
  EXPECT_FALSE(TensorLayout(Shape{8}, {R, S(1)}, {}).check(m).ok());  // no dim 1
  s = TensorLayout{Shape{8, 8}, {S(0), R}, {"dp"}}.check(m);          // flat over a shard axis
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("flat axis 'dp' is S(0), not Replicate"), std::string::npos);
  EXPECT_FALSE(TensorLayout(Shape{8, 8}, {R, R}, {"tp", "dp"}).check(m).ok());  // order
  EXPECT_FALSE(redistribute(TensorLayout{Shape{6, 8}, {R, S(0)}, {}},
                            TensorLayout::replicated(Shape{6, 8}, m), m)
                   .ok());
  EXPECT_FALSE(redistribute(TensorLayout::replicated(Shape{8}, m),
                            TensorLayout::replicated(Shape{4, 2}, m), m)
                   .ok());
}

// The DESIGN.md table, one axis of 4: one step each, and the bytes a ring sends.
TEST(Redistribute, TheTableOnOneAxis) {
  Mesh m({{"tp", 4}});
  const Shape s{8, 12};  // 96 elements, 24 per rank when sharded
  auto L = [&](Placement p) { return TensorLayout{s, {p}, {}}; };
  using K = CommStep::Kind;
  EXPECT_EQ(kinds(plan(L(P), L(R), m)), std::vector<K>{CommStep::all_reduce});
  EXPECT_EQ(kinds(plan(L(P), L(S(1)), m)), std::vector<K>{CommStep::reduce_scatter});
  EXPECT_EQ(kinds(plan(L(S(1)), L(R), m)), std::vector<K>{CommStep::all_gather});
  EXPECT_EQ(kinds(plan(L(S(0)), L(S(1)), m)), std::vector<K>{CommStep::all_to_all});
  EXPECT_EQ(kinds(plan(L(R), L(S(0)), m)), std::vector<K>{CommStep::local_slice});
  EXPECT_EQ(kinds(plan(L(R), L(P), m)), std::vector<K>{CommStep::to_partial});
  EXPECT_TRUE(plan(L(S(0)), L(S(0)), m).empty());
  EXPECT_EQ(sent_bytes(plan(L(P), L(R), m), 4), 2 * 3 * 96 / 4 * 4);
  EXPECT_EQ(sent_bytes(plan(L(S(1)), L(R), m), 4), 3 * 24 * 4);
  EXPECT_EQ(sent_bytes(plan(L(S(0)), L(S(1)), m), 4), 3 * 24 / 4 * 4);
  EXPECT_EQ(sent_bytes(plan(L(R), L(S(0)), m), 4), 0);
  // Sequence parallelism moves what the all-reduce moves: reduce-scatter + all-gather.
  EXPECT_EQ(sent_bytes(plan(L(P), L(S(0)), m), 4) + sent_bytes(plan(L(S(0)), L(R), m), 4),
            sent_bytes(plan(L(P), L(R), m), 4));
  EXPECT_EQ(plan(L(P), L(S(0)), m)[0].to_string(), "reduce_scatter(tp, dim 0): [8,12] -> [2,12]");
}

TEST(Redistribute, ZeroAndTensorParallelAsLayouts) {
  Mesh m({{"dp", 2}, {"tp", 2}});
  const Shape s{8, 4};
  using K = CommStep::Kind;
  // ZeRO-3's gather of a TP-sharded weight: the flat block over dp back to the tp piece.
  TensorLayout stored{s, {R, S(0)}, {"dp"}}, compute{s, {R, S(0)}, {}};
  std::vector<CommStep> g = plan(stored, compute, m);
  EXPECT_EQ(kinds(g), std::vector<K>{CommStep::flat_all_gather});
  EXPECT_EQ(g[0].out_shape, (Shape{4, 4}));
  // ZeRO-2's gradient: Partial on dp to the flat block, one reduce-scatter.
  TensorLayout grad{s, {P, S(0)}, {}};
  EXPECT_EQ(kinds(plan(grad, stored, m)), std::vector<K>{CommStep::flat_reduce_scatter});
  // Plain DP: the gradient all-reduced.
  EXPECT_EQ(kinds(plan(grad, compute, m)), std::vector<K>{CommStep::all_reduce});
}

// Every layout of `global` on `mesh` that check() accepts: R, P, S(d) per axis, and flat
// blocks over every ordered set of non-shard axes.
std::vector<TensorLayout> all_layouts(const Shape& global, const Mesh& mesh, bool flat) {
  std::vector<Placement> choices{R, P};
  for (int d = 0; d < global.rank(); ++d) choices.push_back(S(d));
  const size_t n = mesh.axes().size();
  std::vector<TensorLayout> out;
  std::vector<size_t> pick(n, 0);
  for (;;) {
    TensorLayout l{global, {}, {}};
    for (size_t i = 0; i < n; ++i) l.axes.push_back(choices[pick[i]]);
    for (unsigned mask = 0; mask < (flat ? 1u << n : 1u); ++mask) {
      TensorLayout f = l;
      for (size_t i = 0; i < n; ++i)
        if (mask >> i & 1) f.flat_axes.push_back(mesh.axes()[i].name);
      if (f.check(mesh).ok()) out.push_back(f);
    }
    size_t i = 0;
    while (i < n && ++pick[i] == choices.size()) pick[i++] = 0;
    if (i == n) return out;
  }
}

void check_every_pair(const Mesh& mesh, const Shape& global, bool flat) {
  Buffer x(static_cast<size_t>(global.numel()));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i * 7 % 23) - 11;
  std::vector<TensorLayout> layouts = all_layouts(global, mesh, flat);
  int pairs = 0, steps = 0;
  for (const TensorLayout& from : layouts) {
    Buffers start = scatter(from, mesh, x, 1);
    std::string why;
    ASSERT_EQ(gather(from, mesh, start, &why), x) << from.to_string(mesh) << ": " << why;
    for (const TensorLayout& to : layouts) {
      const std::string pair = from.to_string(mesh) + " -> " + to.to_string(mesh);
      Result<std::vector<CommStep>> r = redistribute(from, to, mesh);
      ASSERT_TRUE(r.ok()) << pair << ": " << r.status().to_string();
      Buffers b = start;
      const TensorLayout* at = &from;
      for (const CommStep& s : *r) {
        ASSERT_EQ(s.before, *at) << pair << " at " << s.to_string();
        b = execute(s, mesh, b);
        at = &s.after;
        for (const Buffer& rb : b)
          ASSERT_EQ(static_cast<int64_t>(rb.size()), s.out_elems) << pair << " " << s.to_string();
      }
      ASSERT_EQ(*at, to) << pair;
      ASSERT_EQ(gather(to, mesh, b, &why), x) << pair << ": " << why;
      ++pairs;
      steps += static_cast<int>(r->size());
    }
  }
  std::printf("%s %s: %zu layouts, %d pairs, %d steps\n", mesh.to_string().c_str(),
              global.to_string().c_str(), layouts.size(), pairs, steps);
}

TEST(Redistribute, EveryPairOnOneAxis) {
  check_every_pair(Mesh({{"tp", 2}}), Shape{4, 6}, true);
  check_every_pair(Mesh({{"tp", 3}}), Shape{6, 3, 2}, true);  // padding: 12 over 3 is exact,
  check_every_pair(Mesh({{"tp", 4}}), Shape{4, 3}, true);     // 3 over 4 is not
}

TEST(Redistribute, EveryPairOnTwoAxes) {
  check_every_pair(Mesh({{"dp", 2}, {"tp", 2}}), Shape{4, 8}, true);
  check_every_pair(Mesh({{"dp", 2}, {"tp", 3}}), Shape{6, 5}, true);  // dim 1 never splits
}

TEST(Redistribute, EveryPairOnThreeAxes) {
  check_every_pair(Mesh({{"pp", 2}, {"dp", 2}, {"tp", 2}}), Shape{8, 4}, true);
}

}  // namespace
}  // namespace tessera
