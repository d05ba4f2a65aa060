#include "io/sharded_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "io/checkpoint.h"
#include "io/fs.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing::contains;
using testing::HookGuard;
using testing::TempDir;

// How a tensor is split over the ranks of a save.
enum class Split {
  ceil_div,    // rank r holds [r * ceil(n / world), ...), clipped; later ranks may hold none
  rank0_only,  // replicated, written by rank 0 only
  all_ranks,   // replicated, every rank writes the whole tensor (overlapping shards)
};

struct Tensor {
  std::string name;
  DType dtype;
  Shape shape;
  Split split;
  std::vector<uint8_t> bytes;  // the full tensor, row-major

  int64_t numel() const { return shape.numel(); }
  int64_t esize() const { return dtype_size(dtype); }
  std::vector<uint8_t> slice(int64_t offset, int64_t count) const {
    return {bytes.begin() + offset * esize(), bytes.begin() + (offset + count) * esize()};
  }
};

// Deterministic bit patterns, different for each tensor and `seed` (float dtypes get finite
// values; the bf16/f16 ones are arbitrary but not NaN so read() comparisons are exact).
Tensor make_tensor(std::string name, DType dtype, Shape shape, Split split, uint32_t seed) {
  Tensor t{std::move(name), dtype, std::move(shape), split, {}};
  t.bytes.resize(static_cast<size_t>(t.numel() * t.esize()));
  uint32_t x = seed * 2654435761u + 12345u;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    const float f = static_cast<float>(static_cast<int32_t>(x >> 8) - (1 << 23)) / 4096.f;
    uint8_t* p = t.bytes.data() + i * t.esize();
    if (dtype == DType::f32) {
      std::memcpy(p, &f, 4);
    } else if (dtype == DType::bf16) {
      uint16_t h = f32_to_bf16(f);
      std::memcpy(p, &h, 2);
    } else if (dtype == DType::f16) {
      uint16_t h = f32_to_f16(f / 1024.f);
      std::memcpy(p, &h, 2);
    } else {
      int32_t v = static_cast<int32_t>(x);
      std::memcpy(p, &v, 4);
    }
  }
  return t;
}

// wte: 35 elements (not divisible by 4 or 2); one: a single element; ln.g and step:
// replicated, rank 0 only; pos: replicated, written by every rank; plus bf16/f16/i32.
std::vector<Tensor> model(uint32_t seed) {
  return {make_tensor("wte", DType::f32, {7, 5}, Split::ceil_div, seed + 1),
          make_tensor("one", DType::f32, {1}, Split::ceil_div, seed + 2),
          make_tensor("ln.g", DType::f32, {6}, Split::rank0_only, seed + 3),
          make_tensor("pos", DType::f32, {3, 4}, Split::all_ranks, seed + 4),
          make_tensor("adam.m/wte", DType::bf16, {7, 5}, Split::ceil_div, seed + 5),
          make_tensor("h.0.w", DType::f16, {2, 3, 3}, Split::ceil_div, seed + 6),
          make_tensor("step", DType::i32, {}, Split::rank0_only, seed + 7)};
}

// [offset, offset + count) of rank `r` under ceil-division flat sharding.
std::pair<int64_t, int64_t> ceil_div_range(int64_t numel, int rank, int world) {
  const int64_t chunk = (numel + world - 1) / world;
  const int64_t begin = std::min(numel, rank * chunk);
  const int64_t end = std::min(numel, begin + chunk);
  return {begin, end - begin};
}

std::vector<TensorShard> shards_of(const std::vector<Tensor>& tensors, int rank, int world) {
  std::vector<TensorShard> out;
  for (const Tensor& t : tensors) {
    int64_t offset = 0, count = t.numel();
    if (t.split == Split::ceil_div) {
      std::tie(offset, count) = ceil_div_range(t.numel(), rank, world);
    } else if (t.split == Split::rank0_only && rank != 0) {
      continue;
    }
    out.push_back({t.name, t.dtype, t.shape, offset, count, t.bytes.data() + offset * t.esize()});
  }
  return out;
}

Status save(const std::string& root, const std::string& name, int world,
            const std::vector<Tensor>& tensors, bool overwrite = false) {
  for (int r = 0; r < world; ++r) {
    TS_RETURN_IF_ERROR(write_checkpoint_shards(root, name, r, world, shards_of(tensors, r, world)));
  }
  return commit_checkpoint_shards(root, name, world, {{"step", 100}, {"model", {{"d", 5}}}},
                                  overwrite);
}

void expect_range(const ShardedCheckpoint& ck, const Tensor& t, int64_t offset, int64_t count) {
  std::vector<uint8_t> got(static_cast<size_t>(count * t.esize()), 0xAB);
  Status s = ck.read_raw(t.name, offset, count, got.data());
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(got, t.slice(offset, count))
      << t.name << " [" << offset << ", " << offset + count << ")";
  if (t.dtype == DType::i32) return;
  std::vector<float> f(static_cast<size_t>(count));
  s = ck.read(t.name, offset, count, f.data());
  ASSERT_TRUE(s.ok()) << s.to_string();
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* p = t.bytes.data() + (offset + i) * t.esize();
    float want;
    uint16_t h;
    if (t.dtype == DType::f32) {
      std::memcpy(&want, p, 4);
    } else {
      std::memcpy(&h, p, 2);
      want = t.dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    ASSERT_EQ(std::memcmp(&f[static_cast<size_t>(i)], &want, 4), 0)
        << t.name << " element " << offset + i;
  }
}

ShardedCheckpoint open_ok(const std::string& path) {
  Result<ShardedCheckpoint> ck = ShardedCheckpoint::open(path);
  EXPECT_TRUE(ck.ok()) << ck.status().to_string();
  return std::move(ck).value();
}

std::string latest_of(const std::string& root) {
  Result<std::string> r = resolve_checkpoint(root);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? base_name(r.value()) : "";
}

TEST(ShardedCheckpoint, WorldFourReadsUnderAnyPlan) {
  TempDir dir;
  const std::vector<Tensor> tensors = model(0);
  ASSERT_TRUE(save(dir.path(), "step-00000100", 4, tensors).ok());
  EXPECT_EQ(latest_of(dir.path()), "step-00000100");
  // Only the manifest and the rank files; no receipts, no staging directory.
  Result<std::vector<std::string>> files = list_dir(dir / "step-00000100");
  ASSERT_TRUE(files.ok());
  EXPECT_EQ(files.value(), (std::vector<std::string>{
                               "manifest.json", "rank-00000.safetensors", "rank-00001.safetensors",
                               "rank-00002.safetensors", "rank-00003.safetensors"}));
  files = list_dir(dir.path());
  ASSERT_TRUE(files.ok());
  EXPECT_EQ(files.value(), (std::vector<std::string>{"latest", "step-00000100"}));

  Result<ShardedCheckpoint> opened = ShardedCheckpoint::open(dir.path());
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  const ShardedCheckpoint& ck = opened.value();
  EXPECT_TRUE(ck.is_sharded());
  EXPECT_EQ(ck.world(), 4);
  EXPECT_EQ(ck.dir(), dir / "step-00000100");
  EXPECT_EQ(ck.manifest()["step"], 100);
  EXPECT_EQ(ck.manifest()["model"]["d"], 5);
  EXPECT_EQ(ck.manifest()["format"], "tessera-sharded-checkpoint");
  EXPECT_EQ(ck.manifest()["world"], 4);
  EXPECT_EQ(ck.manifest()["tensors"]["pos"]["shards"].size(), 4u);
  EXPECT_EQ(ck.manifest()["tensors"]["ln.g"]["shards"].size(), 1u);
  Result<std::string> crc = file_checksum(dir / "step-00000100/rank-00002.safetensors");
  ASSERT_TRUE(crc.ok());
  EXPECT_EQ(ck.manifest()["files"]["rank-00002.safetensors"]["checksum"], crc.value());
  EXPECT_EQ(ck.tensor_names(),
            (std::vector<std::string>{"adam.m/wte", "h.0.w", "ln.g", "one", "pos", "step", "wte"}));
  EXPECT_TRUE(ck.contains("pos"));
  EXPECT_FALSE(ck.contains("po"));
  Result<Shape> shape = ck.global_shape("h.0.w");
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape.value(), (Shape{2, 3, 3}));
  Result<DType> dtype = ck.dtype("adam.m/wte");
  ASSERT_TRUE(dtype.ok());
  EXPECT_EQ(dtype.value(), DType::bf16);

  for (const Tensor& t : tensors) {
    SCOPED_TRACE(t.name);
    for (int world : {1, 2, 3, 4, 5}) {  // ceil-div ranges of other plans
      for (int r = 0; r < world; ++r) {
        auto [offset, count] = ceil_div_range(t.numel(), r, world);
        expect_range(ck, t, offset, count);
      }
    }
    // Every range, so every crossing of a shard boundary (and empty ranges).
    for (int64_t a = 0; a <= t.numel(); ++a) {
      for (int64_t b = a; b <= t.numel(); ++b) expect_range(ck, t, a, b - a);
    }
  }
  // Moving it keeps it usable.
  ShardedCheckpoint moved = std::move(opened).value();
  expect_range(moved, tensors[0], 3, 30);
}

TEST(ShardedCheckpoint, SeveralShardsOfOneTensorOnOneRank) {
  TempDir dir;
  Tensor t = make_tensor("w", DType::f32, {10}, Split::ceil_div, 9);
  // Round robin chunks of 3: rank 0 holds [0,3) and [6,9), rank 1 holds [3,6) and [9,10).
  for (int r = 0; r < 2; ++r) {
    std::vector<TensorShard> shards;
    for (int64_t off = 3 * r; off < 10; off += 6) {
      const int64_t n = std::min<int64_t>(3, 10 - off);
      shards.push_back({"w", DType::f32, {10}, off, n, t.bytes.data() + off * 4});
    }
    ASSERT_TRUE(write_checkpoint_shards(dir.path(), "c", r, 2, shards).ok());
  }
  ASSERT_TRUE(commit_checkpoint_shards(dir.path(), "c", 2, nlohmann::json::object()).ok());
  ShardedCheckpoint ck = open_ok(dir.path());
  EXPECT_EQ(ck.manifest()["tensors"]["w"]["shards"].size(), 4u);
  expect_range(ck, t, 0, 10);
  expect_range(ck, t, 2, 7);
}

TEST(ShardedCheckpoint, ConcurrentReads) {
  TempDir dir;
  const std::vector<Tensor> tensors = model(5);
  ASSERT_TRUE(save(dir.path(), "c", 4, tensors).ok());
  ShardedCheckpoint ck = open_ok(dir.path());
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (const Tensor& t : tensors) {
        auto [offset, count] = ceil_div_range(t.numel(), i, 4);
        expect_range(ck, t, offset, count);
        expect_range(ck, t, 0, t.numel());
      }
    });
  }
  for (std::thread& th : threads) th.join();
}

TEST(ShardedCheckpoint, CommitNeedsEveryRankFile) {
  TempDir dir;
  const std::vector<Tensor> tensors = model(0);
  Status s = commit_checkpoint_shards(dir.path(), "c", 4, nlohmann::json::object());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "no rank has written shards")) << s.message();

  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(write_checkpoint_shards(dir.path(), "c", r, 4, shards_of(tensors, r, 4)).ok());
  }
  s = commit_checkpoint_shards(dir.path(), "c", 4, nlohmann::json::object());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "rank 2 of 4 wrote no shard file")) << s.message();
  EXPECT_TRUE(contains(s, "rank-00002.safetensors is missing")) << s.message();
  EXPECT_NE(s.hint().find("before rank 0 commits"), std::string::npos);
  EXPECT_FALSE(path_exists(dir / "c"));
  EXPECT_FALSE(path_exists(dir / "latest"));

  // A file without its receipt (the rank died between the two writes).
  ASSERT_TRUE(write_checkpoint_shards(dir.path(), "c", 2, 4, shards_of(tensors, 2, 4)).ok());
  ASSERT_TRUE(remove_all(dir / ".tmp-c-shared/rank-00002.json").ok());
  s = commit_checkpoint_shards(dir.path(), "c", 4, nlohmann::json::object());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "rank 2 of 4 did not finish writing rank-00002.safetensors"))
      << s.message();

  // Once rank 2 has written, the commit goes through.
  ASSERT_TRUE(write_checkpoint_shards(dir.path(), "c", 2, 4, shards_of(tensors, 2, 4)).ok());
  ASSERT_TRUE(commit_checkpoint_shards(dir.path(), "c", 4, nlohmann::json::object()).ok());
  ShardedCheckpoint ck = open_ok(dir.path());
  expect_range(ck, tensors[0], 0, 35);
}

TEST(ShardedCheckpoint, CommitFindsUncoveredElement) {
  TempDir dir;
  const std::vector<Tensor> tensors = model(0);
  for (int r = 0; r < 4; ++r) {
    std::vector<TensorShard> shards = shards_of(tensors, r, 4);
    if (r == 1) {  // rank 1 forgets "wte" ([9, 18))
      std::erase_if(shards, [](const TensorShard& s) { return s.name == "wte"; });
    }
    ASSERT_TRUE(write_checkpoint_shards(dir.path(), "c", r, 4, shards).ok());
  }
  Status s = commit_checkpoint_shards(dir.path(), "c", 4, nlohmann::json::object());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s,
                       "tensor 'wte' of shape (7, 5) (35 elements): element 9 (index [1, 4]) "
                       "is not covered by any shard"))
      << s.message();
  EXPECT_NE(s.hint().find("[18, 27) in rank-00002.safetensors"), std::string::npos) << s.hint();

  // The uncovered tail of a tensor.
  TempDir dir2;
  std::vector<float> x(4, 1.f);
  ASSERT_TRUE(
      write_checkpoint_shards(dir2.path(), "c", 0, 1, {{"x", DType::f32, {5}, 0, 4, x.data()}})
          .ok());
  s = commit_checkpoint_shards(dir2.path(), "c", 1, nlohmann::json::object());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "tensor 'x' of shape (5) (5 elements): element 4 is not covered"))
      << s.message();
}

TEST(ShardedCheckpoint, CommitFindsShapeDisagreement) {
  TempDir dir;
  const std::vector<Tensor> tensors = model(0);
  for (int r = 0; r < 4; ++r) {
    std::vector<TensorShard> shards = shards_of(tensors, r, 4);
    if (r == 2) {
      for (TensorShard& s : shards) {
        if (s.name == "wte") s.global_shape = Shape{5, 7};
      }
    }
    ASSERT_TRUE(write_checkpoint_shards(dir.path(), "c", r, 4, shards).ok());
  }
  Status s = commit_checkpoint_shards(dir.path(), "c", 4, nlohmann::json::object());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s,
                       "tensor 'wte': ranks disagree on its shape or dtype: "
                       "rank-00002.safetensors has (5, 7) f32, rank-00000.safetensors has "
                       "(7, 5) f32"))
      << s.message();

  // dtype disagreement too.
  for (int r = 0; r < 4; ++r) {
    std::vector<TensorShard> shards = shards_of(tensors, r, 4);
    if (r == 3) {
      for (TensorShard& s : shards) {
        if (s.name == "pos") s.dtype = DType::i32;
      }
    }
    ASSERT_TRUE(write_checkpoint_shards(dir.path(), "c", r, 4, shards).ok());
  }
  s = commit_checkpoint_shards(dir.path(), "c", 4, nlohmann::json::object());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "tensor 'pos': ranks disagree")) << s.message();
  EXPECT_TRUE(contains(s, "(3, 4) i32")) << s.message();
}

TEST(ShardedCheckpoint, CorruptFileDetectedAtOpen) {
  TempDir dir;
  const std::vector<Tensor> tensors = model(0);
  ASSERT_TRUE(save(dir.path(), "step-00000100", 4, tensors).ok());
  const std::string file = dir / "step-00000100/rank-00002.safetensors";
  Result<std::string> bytes = read_file(file);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() - 3] ^= 0x40;  // inside tensor data
  ASSERT_TRUE(write_file_atomic(file, bytes.value()).ok());
  Result<ShardedCheckpoint> ck = ShardedCheckpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_TRUE(contains(ck.status(), "checkpoint " + (dir / "step-00000100")))
      << ck.status().message();
  EXPECT_TRUE(contains(ck.status(), "file rank-00002.safetensors checksum mismatch"))
      << ck.status().message();
  EXPECT_NE(ck.status().hint().find("resume from an earlier checkpoint"), std::string::npos);
  EXPECT_TRUE(ShardedCheckpoint::open(dir.path(), /*verify_checksums=*/false).ok());

  ASSERT_TRUE(write_file_atomic(file, bytes->substr(0, 100)).ok());
  ck = ShardedCheckpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_TRUE(contains(ck.status(), "file rank-00002.safetensors size mismatch"));
  ASSERT_TRUE(remove_all(file).ok());
  ck = ShardedCheckpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_TRUE(contains(ck.status(), "rank-00002.safetensors listed in manifest.json is missing"));
}

TEST(ShardedCheckpoint, EditedManifestIsRejected) {
  TempDir dir;
  ASSERT_TRUE(save(dir.path(), "c", 4, model(0)).ok());
  const std::string path = dir / "c/manifest.json";
  Result<std::string> text = read_file(path);
  ASSERT_TRUE(text.ok());
  nlohmann::json m = nlohmann::json::parse(text.value());
  m["tensors"]["wte"]["shards"].erase(1);  // drop one shard
  ASSERT_TRUE(write_file_atomic(path, m.dump()).ok());
  Result<ShardedCheckpoint> ck = ShardedCheckpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_TRUE(contains(ck.status(), "element 9 (index [1, 4]) is not covered"))
      << ck.status().message();

  m["format_version"] = 7;
  ASSERT_TRUE(write_file_atomic(path, m.dump()).ok());
  ck = ShardedCheckpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_TRUE(contains(ck.status(), "format_version 7 is not supported"));
}

TEST(ShardedCheckpoint, ReadErrors) {
  TempDir dir;
  ASSERT_TRUE(save(dir.path(), "c", 4, model(0)).ok());
  ShardedCheckpoint ck = open_ok(dir.path());
  std::vector<float> out(64);
  Status s = ck.read("wte", 30, 6, out.data());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s,
                       "read of elements [30, 36) of tensor 'wte' (shape (7, 5), 35 elements) "
                       "is out of bounds"))
      << s.message();
  EXPECT_FALSE(ck.read("wte", -1, 2, out.data()).ok());
  EXPECT_FALSE(ck.read("wte", 0, -1, out.data()).ok());
  EXPECT_FALSE(ck.read("one", 1, 1, out.data()).ok());

  s = ck.read("wtee", 0, 1, out.data());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "no tensor named 'wtee' (did you mean 'wte'?)")) << s.message();
  Result<Shape> shape = ck.global_shape("ln.gg");
  ASSERT_FALSE(shape.ok());
  EXPECT_TRUE(contains(shape.status(), "did you mean 'ln.g'")) << shape.status().message();
  EXPECT_FALSE(ck.global_shape("nothing-like-it").ok());

  s = ck.read("step", 0, 1, out.data());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "tensor 'step' is i32, not float")) << s.message();
}

TEST(ShardedCheckpoint, WriterValidatesInput) {
  TempDir dir;
  std::vector<float> x(4, 1.f);
  Status s = write_checkpoint_shards(dir.path(), "c", 4, 4, {});
  EXPECT_TRUE(contains(s, "invalid rank 4 of world 4")) << s.message();
  s = write_checkpoint_shards(dir.path(), "latest", 0, 1, {});
  EXPECT_TRUE(contains(s, "invalid checkpoint name 'latest'")) << s.message();
  s = write_checkpoint_shards(dir.path(), "../x", 0, 1, {});
  EXPECT_TRUE(contains(s, "invalid checkpoint name")) << s.message();
  s = write_checkpoint_shards(dir.path(), "c", 0, 1, {{"x", DType::f32, {3}, 1, 3, x.data()}});
  EXPECT_TRUE(contains(s, "shard of tensor 'x' range [1, 4) is outside its 3 elements"))
      << s.message();
  s = write_checkpoint_shards(dir.path(), "c", 0, 1, {{"x", DType::f32, {3}, 0, 3, nullptr}});
  EXPECT_TRUE(contains(s, "null data")) << s.message();
  s = write_checkpoint_shards(
      dir.path(), "c", 0, 1,
      {{"x", DType::f32, {4}, 0, 2, x.data()}, {"x", DType::f32, {4}, 0, 2, x.data()}});
  EXPECT_TRUE(contains(s, "at offset 0 is given twice")) << s.message();

  ASSERT_TRUE(
      write_checkpoint_shards(dir.path(), "c", 0, 1, {{"x", DType::f32, {4}, 0, 4, x.data()}})
          .ok());
  s = commit_checkpoint_shards(dir.path(), "c", 1, {{"tensors", 1}});
  EXPECT_TRUE(contains(s, "manifest key 'tensors' is reserved")) << s.message();
  s = commit_checkpoint_shards(dir.path(), "c", 1, nlohmann::json::array());
  EXPECT_TRUE(contains(s, "must be a JSON object")) << s.message();
  // Committing with another world than the ranks wrote for.
  s = commit_checkpoint_shards(dir.path(), "c", 2, nlohmann::json::object());
  EXPECT_TRUE(contains(s, "rank-00000.safetensors was written for world 1, not 2")) << s.message();
  ASSERT_TRUE(commit_checkpoint_shards(dir.path(), "c", 1, nlohmann::json::object()).ok());
}

TEST(ShardedCheckpoint, ReadsCheckpointWriterCheckpoints) {
  TempDir dir;
  const std::vector<Tensor> tensors = model(3);
  {
    CheckpointWriter w(dir.path(), checkpoint_name(100));
    NamedTensorRefs model_refs, optim_refs;
    for (const Tensor& t : tensors) {
      (t.name.starts_with("adam") ? optim_refs : model_refs)
          .push_back({t.name, {t.dtype, t.shape.dims(), t.bytes.data()}});
    }
    ASSERT_TRUE(w.add_tensors("model.safetensors", model_refs).ok());
    ASSERT_TRUE(w.add_tensors("optim.safetensors", optim_refs).ok());
    ASSERT_TRUE(w.commit({{"step", 100}}).ok());
  }
  Result<ShardedCheckpoint> opened = ShardedCheckpoint::open(dir.path());
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  const ShardedCheckpoint& ck = opened.value();
  EXPECT_FALSE(ck.is_sharded());
  EXPECT_EQ(ck.world(), 1);
  EXPECT_EQ(ck.manifest()["step"], 100);
  EXPECT_EQ(ck.tensor_names().size(), tensors.size());
  Result<Shape> shape = ck.global_shape("wte");
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape.value(), (Shape{7, 5}));
  for (const Tensor& t : tensors) {
    SCOPED_TRACE(t.name);
    for (int world : {1, 2, 4}) {
      for (int r = 0; r < world; ++r) {
        auto [offset, count] = ceil_div_range(t.numel(), r, world);
        expect_range(ck, t, offset, count);
      }
    }
  }

  // Corruption is caught there too.
  const std::string file = dir / "step-00000100/optim.safetensors";
  Result<std::string> bytes = read_file(file);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() - 1] ^= 1;
  ASSERT_TRUE(write_file_atomic(file, bytes.value()).ok());
  Result<ShardedCheckpoint> bad = ShardedCheckpoint::open(dir.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status(), "file optim.safetensors checksum mismatch"));

  // The single-process loader refuses sharded checkpoints instead of misreading them.
  ASSERT_TRUE(save(dir.path(), "step-00000200", 2, tensors).ok());
  Result<Checkpoint> old = load_checkpoint(dir / "step-00000200");
  ASSERT_FALSE(old.ok());
  EXPECT_TRUE(contains(old.status(), "is a sharded checkpoint")) << old.status().message();
}

TEST(ShardedCheckpoint, StaleStagingDirFromCrashedAttempt) {
  TempDir dir;
  const std::string root = dir.path();
  // A crashed attempt under world 8 with other data: six ranks wrote, no commit. It also
  // left a temporary file of an interrupted write and a manifest.
  const std::vector<Tensor> old_tensors = model(100);
  for (int r = 0; r < 6; ++r) {
    ASSERT_TRUE(
        write_checkpoint_shards(root, "step-00000100", r, 8, shards_of(old_tensors, r, 8)).ok());
  }
  const std::string staging = root + "/.tmp-step-00000100-shared";
  ASSERT_TRUE(is_directory(staging));
  ASSERT_TRUE(
      write_file_atomic(staging + "/.rank-00001.safetensors.tmp-1-2", std::string("partial")).ok());
  ASSERT_TRUE(write_file_atomic(staging + "/manifest.json", std::string("{}")).ok());
  EXPECT_FALSE(ShardedCheckpoint::open(root).ok());  // nothing committed

  // The next attempt, under world 4, with new data.
  const std::vector<Tensor> tensors = model(200);
  ASSERT_TRUE(save(root, "step-00000100", 4, tensors).ok());
  EXPECT_FALSE(path_exists(staging));
  Result<std::vector<std::string>> files = list_dir(root + "/step-00000100");
  ASSERT_TRUE(files.ok());
  EXPECT_EQ(files->size(), 5u);  // manifest + 4 rank files
  ShardedCheckpoint ck = open_ok(root);
  EXPECT_EQ(ck.world(), 4);
  for (const Tensor& t : tensors) expect_range(ck, t, 0, t.numel());

  // A stale rank file of the crashed world-8 attempt is refused if a rank did not rewrite
  // it (committing world 8 now would otherwise mix in old data).
  for (int r = 0; r < 8; ++r) {
    if (r == 5) continue;
    ASSERT_TRUE(
        write_checkpoint_shards(root, "step-00000200", r, 8, shards_of(tensors, r, 8)).ok());
  }
  ASSERT_TRUE(write_file_atomic(root + "/.tmp-step-00000200-shared/rank-00005.json",
                                std::string(R"({"rank": 5, "world": 4, "bytes": 1, )"
                                            R"("checksum": "00000000"})"))
                  .ok());
  ASSERT_TRUE(write_file_atomic(root + "/.tmp-step-00000200-shared/rank-00005.safetensors",
                                std::string("x"))
                  .ok());
  Status s = commit_checkpoint_shards(root, "step-00000200", 8, nlohmann::json::object());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "rank-00005.safetensors was written for world 4, not 8")) << s.message();
}

TEST(ShardedCheckpoint, FailedCommitKeepsPreviousLatest) {
  TempDir dir;
  const std::string root = dir.path();
  const std::vector<Tensor> v1 = model(1), v2 = model(2), v3 = model(3);
  ASSERT_TRUE(save(root, "step-00000100", 4, v1).ok());

  // 1. Publishing the directory fails: nothing under the final name, latest unchanged.
  {
    HookGuard guard([](FsOp op, const std::string& path) {
      if (op == FsOp::rename && path.ends_with("/step-00000200")) {
        return error("injected rename failure");
      }
      return Status();
    });
    Status s = save(root, "step-00000200", 4, v2);
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(contains(s, "injected")) << s.message();
  }
  EXPECT_FALSE(path_exists(root + "/step-00000200"));
  EXPECT_EQ(latest_of(root), "step-00000100");
  {
    ShardedCheckpoint ck = open_ok(root);
    for (const Tensor& t : v1) expect_range(ck, t, 0, t.numel());
  }
  // The commit can simply be retried: the ranks' files are still staged.
  ASSERT_TRUE(commit_checkpoint_shards(root, "step-00000200", 4, {{"step", 200}}).ok());
  EXPECT_EQ(latest_of(root), "step-00000200");
  {
    ShardedCheckpoint ck = open_ok(root);
    EXPECT_EQ(ck.manifest()["step"], 200);
    for (const Tensor& t : v2) expect_range(ck, t, 0, t.numel());
  }

  // 2. Rewriting `latest` fails: the new checkpoint is complete, latest still the old one.
  {
    HookGuard guard([](FsOp op, const std::string& path) {
      if (op == FsOp::open_write && path.find("latest") != std::string::npos) {
        return error("injected latest failure");
      }
      return Status();
    });
    ASSERT_FALSE(save(root, "step-00000300", 4, v3).ok());
  }
  EXPECT_EQ(latest_of(root), "step-00000200");
  {
    ShardedCheckpoint ck = open_ok(root);
    for (const Tensor& t : v2) expect_range(ck, t, 0, t.numel());
    ShardedCheckpoint newer = open_ok(root + "/step-00000300");
    for (const Tensor& t : v3) expect_range(newer, t, 0, t.numel());
  }

  // 3. A rank failing to write reports the file.
  {
    HookGuard guard([](FsOp op, const std::string& path) {
      if (op == FsOp::write && path.find("rank-00001.safetensors") != std::string::npos) {
        return error("injected disk full");
      }
      return Status();
    });
    Status s = write_checkpoint_shards(root, "step-00000400", 1, 4, shards_of(v3, 1, 4));
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(contains(s, "rank 1")) << s.message();
    EXPECT_TRUE(contains(s, "injected disk full")) << s.message();
  }
  EXPECT_EQ(latest_of(root), "step-00000200");
}

TEST(ShardedCheckpoint, RefusesToOverwriteUnlessAsked) {
  TempDir dir;
  const std::vector<Tensor> v1 = model(1), v2 = model(2);
  ASSERT_TRUE(save(dir.path(), "c", 4, v1).ok());
  Status s = save(dir.path(), "c", 2, v2);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "already exists; refusing to overwrite")) << s.message();
  {
    ShardedCheckpoint ck = open_ok(dir.path());
    for (const Tensor& t : v1) expect_range(ck, t, 0, t.numel());
  }
  ASSERT_TRUE(save(dir.path(), "c", 2, v2, /*overwrite=*/true).ok());
  ShardedCheckpoint ck = open_ok(dir.path());
  EXPECT_EQ(ck.world(), 2);
  for (const Tensor& t : v2) expect_range(ck, t, 0, t.numel());
  Result<std::vector<std::string>> names = list_dir(dir.path());
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names.value(), (std::vector<std::string>{"c", "latest"}));
}

}  // namespace
}  // namespace tessera
