// MixtureLoader: token shares follow the weights, N ranks read one rank's batches, a resumed
// loader continues exactly, each pass over a source is a permutation of its windows, and
// mixture specs that are not FOLDER=WEIGHT are named.
#include "data/mixture_loader.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "data/loader.h"
#include "data/token_shards.h"
#include "data_test_util.h"

namespace tessera {
namespace {

using testing_util::ScratchDir;

constexpr int kVocab = 4096;
constexpr int kT = 16;

// A shard whose every token says its source (source * 1000 + position % 1000).
std::string write_source(const ScratchDir& dir, int source, int tokens) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens));
  for (int i = 0; i < tokens; ++i) ids[i] = source * 1000 + i % 1000;
  const std::string path = dir.file("src" + std::to_string(source) + ".bin");
  EXPECT_TRUE(write_token_shard(path, ids, kVocab).ok());
  return path;
}

MixtureLoader open_mixture(const std::vector<std::string>& paths, std::vector<double> weights,
                           int B, int rank, int world, uint64_t seed) {
  std::vector<std::vector<std::string>> shards;
  for (const std::string& p : paths) shards.push_back({p});
  auto m = MixtureLoader::open(shards, weights, kVocab, B, kT, rank, world, seed);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

TEST(MixtureLoader, TokenSharesFollowTheWeightsOver10000Sequences) {
  ScratchDir dir;
  const std::vector<std::string> paths = {write_source(dir, 0, 5000), write_source(dir, 1, 20000),
                                          write_source(dir, 2, 3000)};
  MixtureLoader m = open_mixture(paths, {0.5, 0.3, 0.2}, 8, 0, 1, 42);
  std::map<int, int64_t> tokens;
  std::vector<int32_t> x, y;
  for (int batch = 0; batch < 1250; ++batch) {  // 10,000 sequences
    m.next(&x, &y);
    for (int32_t t : x) ++tokens[t / 1000];
    if (batch == 124) {  // the first 1,000 sequences are in their shares too
      EXPECT_NEAR(tokens[0] / double(1000 * kT), 0.5, 0.005);
      EXPECT_NEAR(tokens[2] / double(1000 * kT), 0.2, 0.005);
    }
  }
  const double all = 10000.0 * kT;
  EXPECT_NEAR(tokens[0] / all, 0.5, 0.01);
  EXPECT_NEAR(tokens[1] / all, 0.3, 0.01);
  EXPECT_NEAR(tokens[2] / all, 0.2, 0.01);
  std::printf("token shares over 10,000 sequences: %.4f %.4f %.4f (weights 0.5 0.3 0.2)\n",
              tokens[0] / all, tokens[1] / all, tokens[2] / all);
}

TEST(MixtureLoader, TwoRanksReadTheBatchesOfOneAndAResumeContinuesExactly) {
  ScratchDir dir;
  const std::vector<std::string> paths = {write_source(dir, 0, 3000), write_source(dir, 1, 9000)};
  MixtureLoader one = open_mixture(paths, {0.7, 0.3}, 8, 0, 1, 7);
  MixtureLoader r0 = open_mixture(paths, {0.7, 0.3}, 4, 0, 2, 7);
  MixtureLoader r1 = open_mixture(paths, {0.7, 0.3}, 4, 1, 2, 7);
  std::vector<int32_t> x, y, a, ay, b, by;
  LoaderState saved;
  std::vector<std::vector<int32_t>> after;
  for (int batch = 0; batch < 60; ++batch) {
    if (batch == 37) saved = one.state();
    one.next(&x, &y);
    r0.next(&a, &ay);
    r1.next(&b, &by);
    a.insert(a.end(), b.begin(), b.end());
    EXPECT_EQ(a, x) << "batch " << batch;
    if (batch >= 37) after.push_back(x);
  }
  // Through JSON, as a checkpoint keeps it.
  const nlohmann::json j = saved;
  auto state = loader_state_from_json(j);
  ASSERT_TRUE(state.ok());
  MixtureLoader resumed = open_mixture(paths, {0.7, 0.3}, 8, 0, 1, 7);
  ASSERT_TRUE(resumed.restore(*state).ok());
  for (const std::vector<int32_t>& want : after) {
    resumed.next(&x, &y);
    EXPECT_EQ(x, want);
  }
  // Another weighting, or one folder's loader, refuses the state by name.
  MixtureLoader other = open_mixture(paths, {0.5, 0.5}, 8, 0, 1, 7);
  Status s = other.restore(*state);
  EXPECT_NE(s.message().find("the saved state is of the mixture"), std::string::npos)
      << s.message();
  auto single = DataLoader::open(paths[1], kVocab, 8, kT, 0, 1, 7);
  ASSERT_TRUE(single.ok());
  s = single->restore(*state);
  EXPECT_NE(s.message().find("of a mixture of folders"), std::string::npos) << s.message();
}

TEST(MixtureLoader, EachPassOverASourceIsAPermutationOfItsWindows) {
  ScratchDir dir;
  // Source 0: 10 windows of 16 (161 tokens); source 1 large.
  const std::vector<std::string> paths = {write_source(dir, 0, 161), write_source(dir, 1, 50000)};
  MixtureLoader m = open_mixture(paths, {0.5, 0.5}, 4, 0, 1, 3);
  std::vector<int32_t> x, y;
  std::vector<int32_t> firsts;  // the first token of each source-0 row: its window
  while (firsts.size() < 30) {
    m.next(&x, &y);
    for (int r = 0; r < 4; ++r)
      if (x[r * kT] < 1000) firsts.push_back(x[r * kT]);
  }
  for (int pass = 0; pass < 3; ++pass) {
    std::set<int32_t> seen(firsts.begin() + pass * 10, firsts.begin() + pass * 10 + 10);
    EXPECT_EQ(seen.size(), 10u) << "pass " << pass;
  }
  EXPECT_NE(std::vector<int32_t>(firsts.begin(), firsts.begin() + 10),
            std::vector<int32_t>(firsts.begin() + 10, firsts.begin() + 20));  // reshuffled
}

TEST(MixtureLoader, SpecsThatAreNotFolderEqualsWeightAreNamed) {
  auto ok = parse_mixture_spec("web=3,code=1");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->dirs, (std::vector<std::string>{"web", "code"}));
  EXPECT_DOUBLE_EQ(ok->weights[0], 0.75);
  EXPECT_TRUE(is_mixture_spec("a=1"));
  EXPECT_FALSE(is_mixture_spec("data/web"));
  for (const auto& [spec, said] :
       std::vector<std::pair<std::string, std::string>>{{"web=0.7,code", "'code' is not"},
                                                        {"web=x", "weight 'x' of web"},
                                                        {"web=-1", "weight '-1'"},
                                                        {"web=0.5,,b=1", "'' is not"},
                                                        {"=1", "'=1' is not"}}) {
    auto r = parse_mixture_spec(spec);
    ASSERT_FALSE(r.ok()) << spec;
    EXPECT_NE(r.status().message().find(said), std::string::npos) << r.status().message();
  }
  ScratchDir dir;
  const std::vector<std::string> paths = {write_source(dir, 0, 3000), write_source(dir, 1, 10)};
  auto tiny = MixtureLoader::open({{paths[0]}, {paths[1]}}, {0.5, 0.5}, kVocab, 2, kT, 0, 1, 0);
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("fewer than one row"), std::string::npos);
  auto small = MixtureLoader::open({{paths[0]}, {paths[0]}}, {1, 1e-6}, kVocab, 2, kT, 0, 1, 0);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("below one row in 10000"), std::string::npos);
}

}  // namespace
}  // namespace tessera
