#include "io/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "io/fs.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing::contains;
using testing::HookGuard;
using testing::TempDir;

float first_float(const TensorData& t) {
  float f;
  std::memcpy(&f, t.bytes.data(), 4);
  return f;
}

// Writes a small checkpoint whose tensors are filled with `value`: model.safetensors holds
// "wte" (4, 3) and "ln.g" (3); optim.safetensors holds "adam.m.wte" (4, 3) and "step" ().
Status write_checkpoint(const std::string& root, int64_t step, float value,
                        CheckpointWriteOptions options = {}) {
  std::vector<float> wte(12, value), g(3, value), m(12, value / 2);
  int32_t step32 = static_cast<int32_t>(step);
  CheckpointWriter w(root, checkpoint_name(step), options);
  TS_RETURN_IF_ERROR(w.add_tensors(
      "model.safetensors",
      {{"wte", {DType::f32, {4, 3}, wte.data()}}, {"ln.g", {DType::f32, {3}, g.data()}}},
      {{"kind", "model"}}));
  TS_RETURN_IF_ERROR(w.add_tensors(
      "optim.safetensors",
      {{"adam.m.wte", {DType::f32, {4, 3}, m.data()}}, {"step", {DType::i32, {}, &step32}}}));
  nlohmann::json manifest = {{"step", step},
                             {"model", {{"n_layer", 2}, {"d_model", 3}}},
                             {"optimizer", {{"lr", 3e-4}, {"beta1", 0.9}}},
                             {"data", {{"shard", 1}, {"offset", 4096}}},
                             {"rng", {{"seed", 1234}, {"counter", step * 10}}}};
  return w.commit(manifest);
}

std::string latest_of(const std::string& root) {
  Result<std::string> r = resolve_checkpoint(root);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? base_name(r.value()) : "";
}

// Flips one byte of `path` at `offset` from the end.
void flip_byte(const std::string& path, size_t from_end) {
  Result<std::string> bytes = read_file(path);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() - from_end] ^= 0x40;
  ASSERT_TRUE(write_file_atomic(path, bytes.value()).ok());
}

TEST(Checkpoint, NameIsZeroPadded) {
  EXPECT_EQ(checkpoint_name(100), "step-00000100");
  EXPECT_EQ(checkpoint_name(0), "step-00000000");
  EXPECT_LT(checkpoint_name(99), checkpoint_name(100));  // names sort in step order
}

TEST(Checkpoint, RoundTripThroughLatest) {
  TempDir dir;
  const std::string root = dir / "ckpt";
  ASSERT_TRUE(write_checkpoint(root, 100, 1.5f).ok());
  Result<std::string> latest = read_file(root + "/latest");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest.value(), "step-00000100\n");

  Result<Checkpoint> ck = load_checkpoint(root);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->dir(), root + "/step-00000100");
  const nlohmann::json& m = ck->manifest();
  EXPECT_EQ(m["step"], 100);
  EXPECT_EQ(m["model"]["n_layer"], 2);
  EXPECT_DOUBLE_EQ(m["optimizer"]["lr"].get<double>(), 3e-4);
  EXPECT_EQ(m["data"]["offset"], 4096);
  EXPECT_EQ(m["rng"]["counter"], 1000);
  EXPECT_EQ(m["format_version"], kCheckpointFormatVersion);
  EXPECT_EQ(m["name"], "step-00000100");
  ASSERT_TRUE(m["files"].contains("model.safetensors"));
  Result<int64_t> size = file_size(root + "/step-00000100/model.safetensors");
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(m["files"]["model.safetensors"]["bytes"], size.value());
  Result<std::string> crc = file_checksum(root + "/step-00000100/model.safetensors");
  ASSERT_TRUE(crc.ok());
  EXPECT_EQ(m["files"]["model.safetensors"]["checksum"], crc.value());

  EXPECT_EQ(ck->file_names(), (std::vector<std::string>{"model.safetensors", "optim.safetensors"}));
  EXPECT_EQ(ck->tensor_names(), (std::vector<std::string>{"wte", "ln.g", "adam.m.wte", "step"}));
  EXPECT_EQ(first_float(ck->get("wte")), 1.5f);
  EXPECT_EQ(ck->get("wte").shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(first_float(ck->get("adam.m.wte")), 0.75f);
  int32_t step;
  std::memcpy(&step, ck->get("step").bytes.data(), 4);
  EXPECT_EQ(step, 100);
  EXPECT_EQ(ck->file("model.safetensors").metadata().at("kind"), "model");
  Result<const TensorData*> missing = ck->find("wtee");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(contains(missing.status(), "did you mean 'wte'"));

  // Loading the step directory directly gives the same checkpoint.
  Result<Checkpoint> direct = load_checkpoint(root + "/step-00000100");
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(direct->dir(), ck->dir());
  // No temporary directories remain.
  Result<std::vector<std::string>> names = list_dir(root);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names.value(), (std::vector<std::string>{"latest", "step-00000100"}));
}

TEST(Checkpoint, ChecksumMismatchAfterFlippingAByte) {
  TempDir dir;
  ASSERT_TRUE(write_checkpoint(dir.path(), 100, 1.f).ok());
  flip_byte(dir / "step-00000100/optim.safetensors", 3);
  Result<Checkpoint> ck = load_checkpoint(dir.path());
  ASSERT_FALSE(ck.ok());
  const Status& s = ck.status();
  EXPECT_TRUE(contains(s, "checkpoint " + (dir / "step-00000100"))) << s.message();
  EXPECT_TRUE(contains(s, "file optim.safetensors checksum mismatch (expected ")) << s.message();
  EXPECT_NE(s.hint().find("resume from an earlier checkpoint"), std::string::npos);
  // With verification off the flipped byte goes unnoticed (it is inside tensor data).
  EXPECT_TRUE(load_checkpoint(dir.path(), /*verify_checksums=*/false).ok());
}

TEST(Checkpoint, TruncatedAndMissingFiles) {
  TempDir dir;
  ASSERT_TRUE(write_checkpoint(dir.path(), 100, 1.f).ok());
  const std::string model = dir / "step-00000100/model.safetensors";
  Result<std::string> bytes = read_file(model);
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(write_file_atomic(model, bytes->substr(0, bytes->size() - 4)).ok());
  Result<Checkpoint> ck = load_checkpoint(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_TRUE(contains(ck.status(), "file model.safetensors size mismatch"))
      << ck.status().message();

  ASSERT_TRUE(remove_all(model).ok());
  ck = load_checkpoint(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_TRUE(contains(ck.status(), "file model.safetensors listed in manifest.json is missing"))
      << ck.status().message();
}

TEST(Checkpoint, CorruptManifest) {
  TempDir dir;
  ASSERT_TRUE(write_checkpoint(dir.path(), 100, 1.f).ok());
  const std::string manifest = dir / "step-00000100/manifest.json";
  ASSERT_TRUE(write_file_atomic(manifest, std::string("{\"step\": 1,")).ok());
  Result<Checkpoint> ck = load_checkpoint(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_TRUE(contains(ck.status(), "manifest.json is not valid JSON"));
  ASSERT_TRUE(
      write_file_atomic(manifest, std::string(R"({"format_version": 99, "files": {}})")).ok());
  ck = load_checkpoint(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_TRUE(contains(ck.status(), "format_version 99 is not supported"));
  ASSERT_TRUE(
      write_file_atomic(
          manifest,
          std::string(R"({"format_version": 1, "files": {"../x": {"bytes": 1, "checksum": "0"}}})"))
          .ok());
  ck = load_checkpoint(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_TRUE(contains(ck.status(), "entry for file '../x' is malformed"));
}

TEST(Checkpoint, CrashLeavesPreviousCheckpointLoadable) {
  TempDir dir;
  const std::string root = dir.path();
  ASSERT_TRUE(write_checkpoint(root, 100, 1.f).ok());

  // 1. A crash mid-write leaves a .tmp-* directory with partial contents.
  ASSERT_TRUE(make_dirs(root + "/.tmp-step-00000200-99999").ok());
  ASSERT_TRUE(write_file_atomic(root + "/.tmp-step-00000200-99999/model.safetensors",
                                std::string("partial"))
                  .ok());
  EXPECT_EQ(latest_of(root), "step-00000100");
  Result<std::vector<std::string>> listed = list_checkpoints(root);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed.value(), std::vector<std::string>{"step-00000100"});

  // 2. A writer destroyed before commit removes its temporary directory.
  std::string temp;
  {
    CheckpointWriter w(root, checkpoint_name(300));
    std::vector<float> x(4, 9.f);
    ASSERT_TRUE(w.add_tensors("model.safetensors", {{"wte", {DType::f32, {4}, x.data()}}}).ok());
    temp = w.temp_dir();
    EXPECT_TRUE(is_directory(temp));
  }
  EXPECT_FALSE(path_exists(temp));
  EXPECT_FALSE(path_exists(root + "/step-00000300"));

  // 3. Failure when publishing the directory: nothing under the final name.
  {
    HookGuard guard([](FsOp op, const std::string& path) {
      if (op == FsOp::rename && path.ends_with("/step-00000400")) {
        return error("injected rename failure");
      }
      return Status();
    });
    Status s = write_checkpoint(root, 400, 4.f);
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(contains(s, "injected"));
  }
  EXPECT_FALSE(path_exists(root + "/step-00000400"));

  // 4. Failure when rewriting `latest`: the new directory is complete, latest is unchanged.
  {
    HookGuard guard([](FsOp op, const std::string& path) {
      if (op == FsOp::open_write && path.find("latest") != std::string::npos) {
        return error("injected latest failure");
      }
      return Status();
    });
    ASSERT_FALSE(write_checkpoint(root, 500, 5.f).ok());
  }
  EXPECT_EQ(latest_of(root), "step-00000100");
  Result<Checkpoint> ck = load_checkpoint(root);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->manifest()["step"], 100);
  EXPECT_EQ(first_float(ck->get("wte")), 1.f);
  Result<Checkpoint> newer = load_checkpoint(root + "/step-00000500");
  ASSERT_TRUE(newer.ok());
  EXPECT_EQ(first_float(newer->get("wte")), 5.f);
}

// A `latest` holding bytes that name nothing is refused with the bytes escaped and cut short.
TEST(Checkpoint, GarbageInLatestIsShownEscaped) {
  TempDir dir;
  ASSERT_TRUE(write_checkpoint(dir.path(), 100, 1.f).ok());
  std::string junk = std::string("ab\x01") + '\0' + "cd";
  junk += std::string(100, 'z');
  ASSERT_TRUE(write_file_atomic(dir.path() + "/latest", junk).ok());
  Result<std::string> r = resolve_checkpoint(dir.path());
  ASSERT_FALSE(r.ok());
  const std::string m = r.status().message();
  EXPECT_NE(m.find("\"ab\\x01\\x00cd"), std::string::npos) << m;
  EXPECT_NE(m.find("...\""), std::string::npos) << m;
  EXPECT_EQ(m.find('\0'), std::string::npos);
  EXPECT_NE(r.status().hint().find("step-00000100"), std::string::npos);
}

TEST(Checkpoint, RefusesToOverwriteUnlessAsked) {
  TempDir dir;
  ASSERT_TRUE(write_checkpoint(dir.path(), 100, 1.f).ok());
  Status s = write_checkpoint(dir.path(), 100, 2.f);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "already exists; refusing to overwrite")) << s.message();
  EXPECT_NE(s.hint().find("point it at the newest"), std::string::npos);

  // A checkpoint created by someone else between add_tensors and commit is not replaced.
  {
    CheckpointWriter w(dir.path(), "step-00000200");
    std::vector<float> x(2, 7.f);
    ASSERT_TRUE(w.add_tensors("a.safetensors", {{"x", {DType::f32, {2}, x.data()}}}).ok());
    ASSERT_TRUE(write_checkpoint(dir.path(), 200, 2.f).ok());
    Status late = w.commit({{"step", 200}});
    ASSERT_FALSE(late.ok());
    EXPECT_TRUE(contains(late, "already exists"));
  }
  Result<Checkpoint> ck200 = load_checkpoint(dir / "step-00000200");
  ASSERT_TRUE(ck200.ok());
  EXPECT_EQ(first_float(ck200->get("wte")), 2.f);

  Result<Checkpoint> ck = load_checkpoint(dir / "step-00000100");
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ(first_float(ck->get("wte")), 1.f);

  CheckpointWriteOptions opts;
  opts.overwrite = true;
  ASSERT_TRUE(write_checkpoint(dir.path(), 100, 3.f, opts).ok());
  ck = load_checkpoint(dir / "step-00000100");
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ(first_float(ck->get("wte")), 3.f);
  EXPECT_EQ(latest_of(dir.path()), "step-00000100");
  Result<std::vector<std::string>> names = list_dir(dir.path());
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names.value(), (std::vector<std::string>{"latest", "step-00000100", "step-00000200"}));
}

// Without RENAME_EXCHANGE (simulated by failing the first rename onto the final name) the
// overwrite falls back to two renames and still ends with only the new checkpoint.
TEST(Checkpoint, OverwriteWithoutExchangeFallsBack) {
  TempDir dir;
  ASSERT_TRUE(write_checkpoint(dir.path(), 100, 1.f).ok());
  int renames_onto_final = 0;
  {
    HookGuard guard([&](FsOp op, const std::string& path) {
      if (op == FsOp::rename && path.ends_with("/step-00000100") && renames_onto_final++ == 0) {
        return error("injected: exchange not supported");
      }
      return Status();
    });
    CheckpointWriteOptions opts;
    opts.overwrite = true;
    ASSERT_TRUE(write_checkpoint(dir.path(), 100, 6.f, opts).ok());
  }
  EXPECT_EQ(renames_onto_final, 2);  // the failed exchange, then the plain rename
  Result<Checkpoint> ck = load_checkpoint(dir.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(first_float(ck->get("wte")), 6.f);
  Result<std::vector<std::string>> names = list_dir(dir.path());
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names.value(), (std::vector<std::string>{"latest", "step-00000100"}));
}

TEST(Checkpoint, WriterValidatesInput) {
  TempDir dir;
  std::vector<float> x(2, 1.f);
  CheckpointWriter w(dir.path(), "step-1");
  Status s = w.add_tensors("../evil.safetensors", {{"x", {DType::f32, {2}, x.data()}}});
  EXPECT_TRUE(contains(s, "invalid file name '../evil.safetensors'"));
  s = w.add_tensors("manifest.json", {{"x", {DType::f32, {2}, x.data()}}});
  EXPECT_TRUE(contains(s, "invalid file name"));
  ASSERT_TRUE(w.add_tensors("a.safetensors", {{"x", {DType::f32, {2}, x.data()}}}).ok());
  s = w.add_tensors("b.safetensors", {{"x", {DType::f32, {2}, x.data()}}});
  EXPECT_TRUE(contains(s, "tensor 'x' in 'b.safetensors' was already saved in 'a.safetensors'"));
  s = w.add_tensors("a.safetensors", {{"y", {DType::f32, {2}, x.data()}}});
  EXPECT_TRUE(contains(s, "added twice"));
  s = w.commit(nlohmann::json::array({1, 2}));
  EXPECT_TRUE(contains(s, "must be a JSON object"));
  s = w.commit({{"files", 1}});
  EXPECT_TRUE(contains(s, "manifest key 'files' is reserved"));
  ASSERT_TRUE(w.commit({{"step", 1}}).ok());
  Result<Checkpoint> ck = load_checkpoint(dir.path());
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ(ck->tensor_names(), std::vector<std::string>{"x"});

  CheckpointWriter bad(dir.path(), "latest");
  EXPECT_TRUE(contains(bad.commit(nlohmann::json::object()), "invalid checkpoint name 'latest'"));
}

TEST(Checkpoint, ResolveErrors) {
  TempDir dir;
  Result<std::string> r = resolve_checkpoint(dir / "nowhere");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status(), "does not exist"));
  r = resolve_checkpoint(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status(), "neither a checkpoint directory"));

  ASSERT_TRUE(write_checkpoint(dir.path(), 100, 1.f).ok());
  ASSERT_TRUE(write_file_atomic(dir / "latest", std::string("step-00000999\n")).ok());
  r = resolve_checkpoint(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status(), "names 'step-00000999'")) << r.status().message();
  ASSERT_TRUE(remove_all(dir / "latest").ok());
  r = resolve_checkpoint(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().hint().find("step-00000100"), std::string::npos);
  ASSERT_TRUE(write_file_atomic(dir / "latest", std::string("../../etc\n")).ok());
  EXPECT_FALSE(resolve_checkpoint(dir.path()).ok());
}

TEST(Checkpoint, PruneKeepsNewestAndLatest) {
  TempDir dir;
  for (int step : {100, 200, 300, 400}) ASSERT_TRUE(write_checkpoint(dir.path(), step, 1.f).ok());
  // Point latest at an old one (e.g. after a rollback): pruning must keep it.
  ASSERT_TRUE(write_file_atomic(dir / "latest", std::string("step-00000100\n")).ok());
  EXPECT_FALSE(prune_checkpoints(dir.path(), 0).ok());
  ASSERT_TRUE(prune_checkpoints(dir.path(), 1).ok());
  Result<std::vector<std::string>> left = list_checkpoints(dir.path());
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left.value(), (std::vector<std::string>{"step-00000100", "step-00000400"}));
  Result<std::vector<std::string>> all = list_dir(dir.path());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 3u);  // no .tmp-prune-* leftovers
  EXPECT_EQ(latest_of(dir.path()), "step-00000100");

  ASSERT_TRUE(write_file_atomic(dir / "latest", std::string("step-00000400\n")).ok());
  ASSERT_TRUE(prune_checkpoints(dir.path(), 5).ok());  // fewer than keep_last: no-op
  ASSERT_TRUE(prune_checkpoints(dir.path(), 1).ok());
  left = list_checkpoints(dir.path());
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left.value(), std::vector<std::string>{"step-00000400"});
}

}  // namespace
}  // namespace tessera
