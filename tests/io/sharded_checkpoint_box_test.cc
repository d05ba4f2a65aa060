// Checkpoint shards that are N-D boxes of the global tensor (tensor-parallel pieces), perhaps
// cut further into a flat range of the box (ZeRO over the data axes inside each piece):
// saved under one split, read back under every other, element for element.
#include <gtest/gtest.h>

#include <cstring>

#include "io/fs.h"
#include "io/sharded_checkpoint.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing::contains;
using testing::TempDir;

// Elements [offset, offset + count) of the box [lo, hi).
struct Piece {
  std::vector<int64_t> lo, hi;
  int64_t offset = 0, count = 0;
};

int64_t box_numel(const Piece& p) {
  int64_t n = 1;
  for (size_t d = 0; d < p.lo.size(); ++d) n *= p.hi[d] - p.lo[d];
  return n;
}

// `shape` cut `split[d]` ways along each dim (floor bounds: uneven parts allowed), each box
// cut `flat` ways in its row-major order (ceil-division ranges; trailing ones may be empty).
std::vector<Piece> pieces(const std::vector<int64_t>& shape, const std::vector<int>& split,
                          int flat) {
  std::vector<Piece> boxes = {Piece{}};
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<Piece> next;
    for (const Piece& b : boxes)
      for (int k = 0; k < split[d]; ++k) {
        Piece p = b;
        p.lo.push_back(k * shape[d] / split[d]);
        p.hi.push_back((k + 1) * shape[d] / split[d]);
        next.push_back(p);
      }
    boxes = next;
  }
  std::vector<Piece> out;
  for (Piece b : boxes) {
    const int64_t n = box_numel(b), chunk = (n + flat - 1) / flat;
    for (int z = 0; z < flat; ++z) {
      b.offset = std::min(n, z * chunk);
      b.count = std::min(n, b.offset + chunk) - b.offset;
      out.push_back(b);
    }
  }
  return out;
}

// The piece's elements of a dense row-major f32 tensor, in the piece's order.
std::vector<float> dense_piece(const std::vector<float>& dense, const std::vector<int64_t>& shape,
                               const Piece& p) {
  std::vector<float> box;
  std::vector<int64_t> idx = p.lo;
  const int64_t n = box_numel(p);
  for (int64_t i = 0; i < n; ++i) {
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
    box.push_back(dense[static_cast<size_t>(flat)]);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < p.hi[d]) break;
      idx[d] = p.lo[d];
    }
  }
  return {box.begin() + p.offset, box.begin() + p.offset + p.count};
}

std::vector<float> iota(int64_t n, float base) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = base + static_cast<float>(i);
  return v;
}

struct Named {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> dense;
};

// One rank per piece; rank r writes piece r of every tensor.
Status save_split(const std::string& root, const std::vector<Named>& tensors,
                  const std::vector<std::vector<Piece>>& split) {
  const int world = static_cast<int>(split[0].size());
  std::vector<std::vector<float>> keep;
  for (int r = 0; r < world; ++r) {
    std::vector<TensorShard> shards;
    keep.clear();
    for (size_t t = 0; t < tensors.size(); ++t) {
      const Piece& p = split[t][static_cast<size_t>(r)];
      keep.push_back(dense_piece(tensors[t].dense, tensors[t].shape, p));
    }
    for (size_t t = 0; t < tensors.size(); ++t) {
      const Piece& p = split[t][static_cast<size_t>(r)];
      shards.push_back({tensors[t].name, DType::f32, Shape(tensors[t].shape), p.offset, p.count,
                        keep[t].data(), p.lo, p.hi});
    }
    TS_RETURN_IF_ERROR(write_checkpoint_shards(root, "c", r, world, shards));
  }
  return commit_checkpoint_shards(root, "c", world, nlohmann::json::object());
}

void expect_piece(const ShardedCheckpoint& ck, const Named& t, const Piece& p) {
  std::vector<float> got(static_cast<size_t>(p.count), -1.0f);
  Status s = ck.read_box(t.name, p.lo, p.hi, p.offset, p.count, got.data());
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(got, dense_piece(t.dense, t.shape, p))
      << t.name << " box [" << p.lo[0] << ":" << p.hi[0] << ", ...) offset " << p.offset;
}

// Every way of cutting a 2-D and a 3-D tensor into at most 2-3 parts per dim and 1-3 flat
// parts per box: one rank per piece.
std::vector<std::pair<std::vector<int>, int>> splits(size_t rank) {
  std::vector<std::pair<std::vector<int>, int>> out;
  if (rank == 2) {
    for (int a : {1, 2, 3})
      for (int b : {1, 2, 4})
        for (int f : {1, 2, 3}) out.push_back({{a, b}, f});
  } else {
    for (int a : {1, 2})
      for (int b : {1, 3})
        for (int c : {1, 2})
          for (int f : {1, 2}) out.push_back({{a, b, c}, f});
  }
  return out;
}

TEST(ShardedCheckpointBoxes, SavedUnderAnySplitReadUnderAnyOther) {
  const std::vector<Named> tensors = {{"w", {6, 8}, iota(48, 0.0f)},
                                      {"h.0.qkv", {2, 3, 4}, iota(24, 100.0f)}};
  for (const auto& [save_cut, save_flat] : splits(2)) {
    // The 3-D tensor is cut into as many pieces as the 2-D one has ranks: along dim 1 (3 ways)
    // and flat, or flat only.
    const std::vector<Piece> w = pieces(tensors[0].shape, save_cut, save_flat);
    const int world = static_cast<int>(w.size());
    std::vector<Piece> q = world % 3 == 0 ? pieces(tensors[1].shape, {1, 3, 1}, world / 3)
                                          : pieces(tensors[1].shape, {1, 1, 1}, world);
    SCOPED_TRACE("saved as " + std::to_string(save_cut[0]) + "x" + std::to_string(save_cut[1]) +
                 " boxes, flat " + std::to_string(save_flat));
    TempDir dir;
    Status saved = save_split(dir.path(), tensors, {w, q});
    ASSERT_TRUE(saved.ok()) << saved.to_string();
    ShardedCheckpoint ck = ShardedCheckpoint::open(dir.path()).value();
    const bool boxes = save_cut != std::vector<int>{1, 1} || world % 3 == 0;
    EXPECT_EQ(ck.manifest()["format_version"], boxes ? 2 : 1);
    for (const Named& t : tensors)
      for (const auto& [cut, flat] : splits(t.shape.size()))
        for (const Piece& p : pieces(t.shape, cut, flat)) expect_piece(ck, t, p);
    // Flat reads of the whole tensor cross every box boundary.
    std::vector<float> all(48);
    ASSERT_TRUE(ck.read("w", 0, 48, all.data()).ok());
    EXPECT_EQ(all, tensors[0].dense);
  }
}

TEST(ShardedCheckpointBoxes, MissingBoxIsNamedAtCommit) {
  TempDir dir;
  const std::vector<float> dense = iota(48, 0.0f);
  // Two column halves written, the lower-right quarter of the right half left out.
  std::vector<float> left = dense_piece(dense, {6, 8}, Piece{{0, 0}, {6, 4}, 0, 24});
  std::vector<float> right = dense_piece(dense, {6, 8}, Piece{{0, 4}, {3, 8}, 0, 12});
  ASSERT_TRUE(
      write_checkpoint_shards(dir.path(), "c", 0, 2,
                              {{"w", DType::f32, {6, 8}, 0, 24, left.data(), {0, 0}, {6, 4}}})
          .ok());
  ASSERT_TRUE(
      write_checkpoint_shards(dir.path(), "c", 1, 2,
                              {{"w", DType::f32, {6, 8}, 0, 12, right.data(), {0, 4}, {3, 8}}})
          .ok());
  Status s = commit_checkpoint_shards(dir.path(), "c", 2, nlohmann::json::object());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "element 28 (index [3, 4]) is not covered by any shard"))
      << s.to_string();
  EXPECT_NE(s.to_string().find("[0, 12) of box [0:3, 4:8] in rank-00001.safetensors"),
            std::string::npos)
      << s.to_string();
}

TEST(ShardedCheckpointBoxes, BadBoxesAreRefusedWithTheirBounds) {
  TempDir dir;
  std::vector<float> data(48, 1.0f);
  auto write = [&](TensorShard s) { return write_checkpoint_shards(dir.path(), "c", 0, 1, {s}); };
  Status s = write({"w", DType::f32, {6, 8}, 0, 12, data.data(), {0, 4}, {3, 9}});
  EXPECT_TRUE(contains(s, "box [0:3, 4:9] is outside shape (6, 8)")) << s.to_string();
  s = write({"w", DType::f32, {6, 8}, 0, 12, data.data(), {0}, {3}});
  EXPECT_TRUE(contains(s, "has a box with 1 lower and 1 upper bounds for shape (6, 8)"))
      << s.to_string();
  s = write({"w", DType::f32, {6, 8}, 0, 12, data.data(), {0, 4}, {3}});
  EXPECT_TRUE(contains(s, "has a box with 2 lower and 1 upper bounds")) << s.to_string();
  s = write({"w", DType::f32, {6, 8}, 4, 12, data.data(), {0, 4}, {3, 8}});
  EXPECT_TRUE(contains(s, "range [4, 16) is outside its 12 elements")) << s.to_string();

  ASSERT_TRUE(write({"w", DType::f32, {6, 8}, 0, 48, data.data(), {}, {}}).ok());
  ASSERT_TRUE(commit_checkpoint_shards(dir.path(), "c", 1, nlohmann::json::object()).ok());
  ShardedCheckpoint ck = ShardedCheckpoint::open(dir.path()).value();
  std::vector<float> out(12);
  s = ck.read_box("w", {0, 4}, {3, 9}, 0, 12, out.data());
  EXPECT_TRUE(contains(s,
                       "tensor 'w' (shape (6, 8), 48 elements) is out of bounds: box [0:3, "
                       "4:9] is outside shape (6, 8)"))
      << s.to_string();
  s = ck.read_box("w", {0, 4}, {3, 8}, 6, 12, out.data());
  EXPECT_TRUE(contains(s, "range [6, 18) is outside its 12 elements")) << s.to_string();
  ASSERT_TRUE(ck.read_box("w", {0, 4}, {3, 8}, 0, 12, out.data()).ok());
  EXPECT_EQ(out[5], 1.0f);
}

// A manifest edited to hold a box outside its tensor is refused at open, naming the box.
TEST(ShardedCheckpointBoxes, EditedManifestBoxIsRefused) {
  TempDir dir;
  const std::vector<Named> tensors = {{"w", {6, 8}, iota(48, 0.0f)}};
  ASSERT_TRUE(save_split(dir.path(), tensors, {pieces({6, 8}, {1, 2}, 1)}).ok());
  const std::string manifest = dir / "c/manifest.json";
  nlohmann::json m = nlohmann::json::parse(read_file(manifest).value());
  m["tensors"]["w"]["shards"][1]["box"]["hi"] = {6, 9};
  ASSERT_TRUE(write_file_atomic(manifest, m.dump()).ok());
  Result<ShardedCheckpoint> ck = ShardedCheckpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_TRUE(contains(ck.status(), "box [0:6, 4:9] is outside shape (6, 8)"))
      << ck.status().to_string();
}

}  // namespace
}  // namespace tessera
