#include "data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "data_test_util.h"

namespace tessera {
namespace {

using testing_util::ScratchDir;

constexpr int kVocab = 50257;

struct Batch {
  std::vector<int32_t> x, y;
  bool operator==(const Batch&) const = default;
};

// A shard whose token i is i % kVocab, so every window's contents reveal where it starts.
std::string make_shard(const ScratchDir& dir, int n, const std::string& name = "t.bin") {
  std::vector<int32_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = i % kVocab;
  std::string path = dir.file(name);
  EXPECT_TRUE(write_token_shard(path, tokens, kVocab).ok());
  return path;
}

DataLoader open_ok(const std::string& path, int B, int T, int rank = 0, int world = 1,
                   uint64_t seed = 0) {
  auto r = DataLoader::open(path, kVocab, B, T, rank, world, seed);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

std::vector<Batch> take(DataLoader& loader, int n) {
  std::vector<Batch> out(n);
  for (Batch& b : out) loader.next(&b.x, &b.y);
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(DataLoader, SequentialBatchesAreConsecutiveWindowsWithShiftedTargets) {
  ScratchDir dir;
  const int B = 3, T = 8;
  DataLoader loader = open_ok(make_shard(dir, 1000), B, T);
  EXPECT_EQ(loader.num_windows(), 999 / T);
  EXPECT_EQ(loader.batches_per_epoch(), (999 / T) / B);
  std::vector<Batch> batches = take(loader, 2);
  for (int step = 0; step < 2; ++step) {
    ASSERT_EQ(batches[step].x.size(), size_t(B * T));
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        int32_t want = (step * B + b) * T + t;  // window (step*B + b) starts there
        EXPECT_EQ(batches[step].x[b * T + t], want);
        EXPECT_EQ(batches[step].y[b * T + t], want + 1);
      }
    }
  }
}

TEST(DataLoader, SequentialWrapsToTheStartAfterAnEpoch) {
  ScratchDir dir;
  DataLoader loader = open_ok(make_shard(dir, 101), /*B=*/2, /*T=*/10);  // 10 windows, 5 batches
  ASSERT_EQ(loader.batches_per_epoch(), 5);
  std::vector<Batch> first = take(loader, 5);
  EXPECT_EQ(loader.state().epoch, 1u);
  EXPECT_EQ(loader.state().position, 0u);
  EXPECT_EQ(take(loader, 5), first);
}

TEST(DataLoader, ShuffledOrderIsDeterministicAndCoversEveryWindowOncePerEpoch) {
  ScratchDir dir;
  const int B = 4, T = 5;
  std::string path = make_shard(dir, 20 * 4 * T + 1);  // 80 windows, 20 batches
  DataLoader a = open_ok(path, B, T, 0, 1, /*seed=*/42);
  DataLoader b = open_ok(path, B, T, 0, 1, /*seed=*/42);
  DataLoader c = open_ok(path, B, T, 0, 1, /*seed=*/43);
  ASSERT_EQ(a.batches_per_epoch(), 20);
  std::vector<Batch> ea = take(a, 40);
  EXPECT_EQ(take(b, 40), ea);
  EXPECT_NE(take(c, 40), ea);
  std::vector<int32_t> first_epoch_order;
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int32_t> starts;
    for (int s = 0; s < 20; ++s) {
      for (int row = 0; row < B; ++row) {
        int32_t start = ea[epoch * 20 + s].x[row * T];
        EXPECT_EQ(start % T, 0);
        EXPECT_EQ(ea[epoch * 20 + s].y[row * T + T - 1], start + T);
        starts.insert(start);
        if (epoch == 0) first_epoch_order.push_back(start);
      }
    }
    EXPECT_EQ(starts.size(), 80u) << "epoch " << epoch;
  }
  // Epochs use different permutations, and neither is the file order.
  EXPECT_NE(std::vector<Batch>(ea.begin(), ea.begin() + 20),
            std::vector<Batch>(ea.begin() + 20, ea.end()));
  EXPECT_FALSE(std::is_sorted(first_epoch_order.begin(), first_epoch_order.end()));
}

TEST(DataLoader, RestoreGivesIdenticalSubsequentBatches) {
  ScratchDir dir;
  std::string path = make_shard(dir, 2000);
  for (uint64_t seed : {uint64_t{0}, uint64_t{9}}) {
    DataLoader loader = open_ok(path, 4, 16, 0, 1, seed);  // 124 windows, 31 batches
    take(loader, 29);
    nlohmann::json saved = loader.state();       // through JSON, as in a checkpoint
    std::vector<Batch> after = take(loader, 5);  // crosses the epoch boundary

    DataLoader resumed = open_ok(path, 4, 16, 0, 1, seed);
    take(resumed, 3);  // restore must not depend on where this one is
    auto state = loader_state_from_json(saved);
    ASSERT_TRUE(state.ok()) << state.status().to_string();
    EXPECT_EQ(state->position, 29u);
    ASSERT_TRUE(resumed.restore(*state).ok());
    EXPECT_EQ(take(resumed, 5), after) << "seed " << seed;
    EXPECT_EQ(resumed.state(), loader.state());
  }
}

TEST(DataLoader, RanksSplitTheSingleRankGlobalBatch) {
  ScratchDir dir;
  std::string path = make_shard(dir, 3001);
  const int B = 2, T = 12;
  for (uint64_t seed : {uint64_t{0}, uint64_t{5}}) {
    for (int world : {2, 4}) {
      DataLoader global = open_ok(path, world * B, T, 0, 1, seed);
      std::vector<DataLoader> ranks;
      for (int r = 0; r < world; ++r) ranks.push_back(open_ok(path, B, T, r, world, seed));
      int steps = static_cast<int>(global.batches_per_epoch()) + 3;  // past an epoch
      for (int step = 0; step < steps; ++step) {
        Batch g;
        global.next(&g.x, &g.y);
        for (int r = 0; r < world; ++r) {
          Batch mine;
          ranks[r].next(&mine.x, &mine.y);
          auto lo = g.x.begin() + r * B * T, hi = lo + B * T;
          EXPECT_EQ(mine.x, std::vector<int32_t>(lo, hi))
              << "seed " << seed << " world " << world << " rank " << r << " step " << step;
          auto ylo = g.y.begin() + r * B * T;
          EXPECT_EQ(mine.y, std::vector<int32_t>(ylo, ylo + B * T));
        }
      }
    }
  }
}

TEST(DataLoader, RestoreAcrossADifferentWorldWithTheSameGlobalBatch) {
  ScratchDir dir;
  std::string path = make_shard(dir, 3001);
  DataLoader one = open_ok(path, 4, 10, 0, 1, 3);
  take(one, 7);
  LoaderState saved = one.state();
  Batch g;
  one.next(&g.x, &g.y);
  DataLoader rank1 = open_ok(path, 2, 10, 1, 2, 3);
  ASSERT_TRUE(rank1.restore(saved).ok());
  Batch mine;
  rank1.next(&mine.x, &mine.y);
  EXPECT_EQ(mine.x, std::vector<int32_t>(g.x.begin() + 20, g.x.end()));
}

TEST(DataLoader, RestoreRejectsAStateThatDoesNotFit) {
  ScratchDir dir;
  std::string path = make_shard(dir, 2000);
  DataLoader loader = open_ok(path, 4, 16, 0, 1, 1);
  LoaderState good = loader.state();

  LoaderState other_file = good;
  other_file.num_tokens = 5000;
  Status s = loader.restore(other_file);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.message(), path));
  EXPECT_TRUE(contains(s.message(), "5000 tokens"));

  LoaderState other_t = good;
  other_t.seq_len = 32;
  EXPECT_TRUE(contains(loader.restore(other_t).message(), "4 rows x 32 tokens"));

  LoaderState other_seed = good;
  other_seed.seed = 2;
  EXPECT_TRUE(contains(loader.restore(other_seed).message(), "seed 2"));

  LoaderState past_end = good;
  past_end.position = static_cast<uint64_t>(loader.batches_per_epoch());
  EXPECT_TRUE(contains(loader.restore(past_end).message(), "past the end"));

  // A refused restore leaves the loader where it was.
  EXPECT_EQ(loader.state(), good);
  EXPECT_TRUE(loader.restore(good).ok());
}

TEST(DataLoader, MalformedJsonStateIsAnError) {
  nlohmann::json j = {{"epoch", 1}, {"position", 2}};
  auto r = loader_state_from_json(j);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "malformed"));
  LoaderState s{3, 4, 5, 6, 7, 8, "1000000:7000,500000:3000"};
  EXPECT_EQ(nlohmann::json(s).get<LoaderState>(), s);
}

TEST(DataLoader, FileTooSmallForOneBatchIsAnError) {
  ScratchDir dir;
  std::string path = make_shard(dir, 64);  // 63 / 8 = 7 windows
  auto r = DataLoader::open(path, kVocab, 4, 8, 0, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), path));
  EXPECT_TRUE(contains(r.status().message(), "too few"));
  EXPECT_TRUE(contains(r.status().message(), "needs 65"));
  EXPECT_TRUE(DataLoader::open(path, kVocab, 7, 8).ok());  // exactly one batch fits
}

// A folder of shards (llm.c's fineweb_train_*.bin beside fineweb_val_*.bin, or Tessera's
// own) reads as one: each shard cut into its own windows, the shards in name order; two ranks
// split the one-rank global batches; a restored loader continues the same.
TEST(DataLoader, AFolderOfShardsReadsAsOne) {
  ScratchDir dir;
  const int T = 8;
  // Shards of 41, 9 (a window short of two) and 33 tokens; token i of shard s is 1000 s + i.
  const std::vector<int> sizes = {41, 9, 33};
  for (size_t s = 0; s < sizes.size(); ++s) {
    std::vector<int32_t> tokens(static_cast<size_t>(sizes[s]));
    for (int i = 0; i < sizes[s]; ++i)
      tokens[static_cast<size_t>(i)] = 1000 * static_cast<int>(s) + i;
    ASSERT_TRUE(write_token_shard(dir.file("web_train_00000" + std::to_string(3 - s) + ".bin"),
                                  tokens, kVocab)
                    .ok());
  }
  make_shard(dir, 100, "web_val_000000.bin");
  Result<ShardFiles> files = find_token_shards(dir.path());
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  ASSERT_EQ(files->train.size(), 3u);
  EXPECT_TRUE(contains(files->train[0], "web_train_000001.bin"));  // name order
  ASSERT_EQ(files->val.size(), 1u);
  auto opened = DataLoader::open(files->train, kVocab, 1, T);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  DataLoader one = std::move(opened).value();
  // Name order: the 33-token shard (2000 + i; 4 windows), then 9 (1000 + i; 1), then 41 (0 + i; 5).
  EXPECT_EQ(one.num_windows(), 4 + 1 + 5);
  const std::vector<int32_t> starts = {2000, 2008, 2016, 2024, 1000, 0, 8, 16, 24, 32};
  std::vector<Batch> all = take(one, 10);
  for (size_t w = 0; w < starts.size(); ++w) {
    EXPECT_EQ(all[w].x[0], starts[w]) << "window " << w;
    EXPECT_EQ(all[w].y[T - 1], starts[w] + T) << "window " << w;
  }
  // Two ranks of one row each see the one-rank batches of two rows, shuffled or not.
  for (uint64_t seed : {uint64_t{0}, uint64_t{7}}) {
    DataLoader both = DataLoader::open(files->train, kVocab, 2, T, 0, 1, seed).value();
    DataLoader r0 = DataLoader::open(files->train, kVocab, 1, T, 0, 2, seed).value();
    DataLoader r1 = DataLoader::open(files->train, kVocab, 1, T, 1, 2, seed).value();
    for (int step = 0; step < 7; ++step) {
      const Batch b = take(both, 1)[0], a0 = take(r0, 1)[0], a1 = take(r1, 1)[0];
      EXPECT_EQ(std::vector<int32_t>(b.x.begin(), b.x.begin() + T), a0.x) << step;
      EXPECT_EQ(std::vector<int32_t>(b.x.begin() + T, b.x.end()), a1.x) << step;
    }
    const LoaderState saved = both.state();
    DataLoader again = DataLoader::open(files->train, kVocab, 2, T, 0, 1, seed).value();
    ASSERT_TRUE(again.restore(saved).ok());
    EXPECT_EQ(take(again, 3), take(both, 3));
  }
  ScratchDir empty;
  Result<ShardFiles> none = find_token_shards(empty.path());
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(contains(none.status().message(), "neither train.bin and val.bin"));
}

TEST(DataLoader, BadArgumentsAndMissingFileAreErrors) {
  ScratchDir dir;
  std::string path = make_shard(dir, 1000);
  EXPECT_FALSE(DataLoader::open(path, kVocab, 0, 8).ok());
  EXPECT_FALSE(DataLoader::open(path, kVocab, 2, 0).ok());
  auto r = DataLoader::open(path, kVocab, 2, 8, /*rank=*/2, /*world=*/2);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "rank 2"));
  r = DataLoader::open(dir.file("none.bin"), kVocab, 2, 8);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "does not exist"));
}

}  // namespace
}  // namespace tessera
