// Shared by the CLI training tests: a synthetic, learnable token stream and the losses of a
// run's metrics.jsonl.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "data/token_shards.h"

namespace tessera {

// <dir>/train.bin (4000 tokens) and <dir>/val.bin (1000): a repeating pattern with noise.
inline void write_learnable_tokens(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int32_t>((i % 17) * 11 + (rng() % 3));
  ASSERT_TRUE(write_token_shard((dir / "train.bin").string(), tokens, 50257).ok());
  ASSERT_TRUE(write_token_shard((dir / "val.bin").string(),
                                std::span<const int32_t>(tokens).subspan(0, 1000), 50257)
                  .ok());
}

// The "loss": fields of metrics.jsonl, as written ("\"loss\":10.84...").
inline std::vector<std::string> metric_losses(const std::filesystem::path& metrics) {
  std::ifstream in(metrics);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    auto p = line.find("\"loss\":");
    if (p != std::string::npos) out.push_back(line.substr(p, line.find(',', p) - p));
  }
  return out;
}

// A test with its own directory (removed after) holding the learnable tokens in data/, and
// TrainOptions for gpt-tiny on them writing to <dir>/<out>.
// The last "val_loss" of a run's metrics.jsonl (-1, and a failure, when there is none).
inline double last_val_loss(const std::filesystem::path& metrics) {
  std::ifstream in(metrics);
  std::string line;
  double v = -1;
  while (std::getline(in, line)) {
    auto p = line.find("\"val_loss\":");
    if (p != std::string::npos) v = std::stod(line.substr(p + 11));
  }
  EXPECT_GE(v, 0) << metrics;
  return v;
}

class TrainDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tessera_cli_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    write_learnable_tokens(dir_ / "data");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  TrainOptions tiny_options(const std::string& out) const {
    TrainOptions o;
    o.model = "gpt-tiny";
    o.data = (dir_ / "data").string();
    o.out = (dir_ / out).string();
    o.batch = 2;
    o.seq = 16;
    o.sample_tokens = 0;
    return o;
  }

  std::filesystem::path dir_;
};

// Runs a shell command; returns its exit code and puts stdout+stderr in *out.
inline int run_command(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  out->clear();
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

}  // namespace tessera
