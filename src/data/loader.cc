#include "data/loader.h"

#include <nlohmann/json.hpp>
#include <numeric>

#include "base/check.h"

namespace tessera {
namespace {

// SplitMix64: a tiny generator whose output is fixed by its seed on every platform (the
// standard distributions are not), so shuffles are reproducible anywhere.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), without modulo bias.
  uint64_t below(uint64_t n) {
    uint64_t threshold = (0 - n) % n;
    for (;;) {
      uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }

 private:
  uint64_t state_;
};

std::string shape_text(int64_t rows, int64_t T) {
  return std::to_string(rows) + " rows x " + std::to_string(T) + " tokens";
}

}  // namespace

void to_json(nlohmann::json& j, const LoaderState& s) {
  j = nlohmann::json{{"epoch", s.epoch},     {"position", s.position},
                     {"seed", s.seed},       {"global_rows", s.global_rows},
                     {"seq_len", s.seq_len}, {"num_tokens", s.num_tokens}};
}

void from_json(const nlohmann::json& j, LoaderState& s) {
  j.at("epoch").get_to(s.epoch);
  j.at("position").get_to(s.position);
  j.at("seed").get_to(s.seed);
  j.at("global_rows").get_to(s.global_rows);
  j.at("seq_len").get_to(s.seq_len);
  j.at("num_tokens").get_to(s.num_tokens);
}

Result<LoaderState> loader_state_from_json(const nlohmann::json& j) {
  try {
    return j.get<LoaderState>();
  } catch (const nlohmann::json::exception& e) {
    return error(std::string("data loader state ") + j.dump() + " is malformed: " + e.what(),
                 "the checkpoint's \"loader\" entry must hold epoch, position, seed, "
                 "global_rows, seq_len and num_tokens as written by DataLoader::state()");
  }
}

Result<DataLoader> DataLoader::open(const std::string& path, int vocab_size, int B, int T, int rank,
                                    int world, uint64_t seed) {
  if (B < 1 || T < 1) {
    return error("data loader for '" + path + "': batch B=" + std::to_string(B) +
                     " and sequence length T=" + std::to_string(T) + " must both be >= 1",
                 "set a positive batch size and sequence length in the config");
  }
  if (world < 1 || rank < 0 || rank >= world) {
    return error("data loader for '" + path + "': rank " + std::to_string(rank) +
                     " is not in a world of " + std::to_string(world) + " ranks",
                 "rank must be in [0, world)");
  }
  TS_ASSIGN_OR_RETURN(TokenShard shard, TokenShard::open(path, vocab_size));
  int64_t rows = static_cast<int64_t>(world) * B;
  int64_t windows = shard.size() > 0 ? (shard.size() - 1) / T : 0;
  if (windows < rows) {
    return error("token shard '" + path + "' has " + std::to_string(shard.size()) +
                     " tokens, too few for one global batch of " + shape_text(rows, T) +
                     " (needs " + std::to_string(rows * T + 1) + ")",
                 "use a smaller batch size B or sequence length T, or tokenize more text");
  }
  return DataLoader(std::move(shard), B, T, rank, world, seed);
}

DataLoader::DataLoader(TokenShard shard, int B, int T, int rank, int world, uint64_t seed)
    : shard_(std::move(shard)), B_(B), T_(T), rank_(rank), world_(world), seed_(seed) {
  num_windows_ = (shard_.size() - 1) / T_;
  batches_per_epoch_ = num_windows_ / (static_cast<int64_t>(world_) * B_);
  TS_CHECK_GE(batches_per_epoch_, 1);
  start_epoch(0);
}

void DataLoader::start_epoch(uint64_t epoch) {
  epoch_ = epoch;
  position_ = 0;
  if (seed_ == 0) {
    order_.clear();
    return;
  }
  order_.resize(static_cast<size_t>(num_windows_));
  std::iota(order_.begin(), order_.end(), int64_t{0});
  // The stream depends only on (seed, epoch): mix them so nearby seeds/epochs differ.
  SplitMix64 rng(SplitMix64(seed_).next() ^ (epoch * 0xD1B54A32D192ED03ull + 1));
  for (size_t i = order_.size() - 1; i > 0; --i) {
    size_t j = static_cast<size_t>(rng.below(i + 1));
    std::swap(order_[i], order_[j]);
  }
}

int64_t DataLoader::window_of(int64_t row) const {
  return order_.empty() ? row : order_[static_cast<size_t>(row)];
}

void DataLoader::next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets) {
  TS_CHECK(inputs != nullptr && targets != nullptr);
  const size_t n = static_cast<size_t>(B_) * T_;
  inputs->resize(n);
  targets->resize(n);
  std::vector<int32_t> window(static_cast<size_t>(T_) + 1);
  const int64_t global_rows = static_cast<int64_t>(world_) * B_;
  const int64_t first_row =
      static_cast<int64_t>(position_) * global_rows + static_cast<int64_t>(rank_) * B_;
  for (int b = 0; b < B_; ++b) {
    int64_t w = window_of(first_row + b);
    shard_.read(w * T_, T_ + 1, window.data());
    std::copy(window.begin(), window.end() - 1, inputs->begin() + b * T_);
    std::copy(window.begin() + 1, window.end(), targets->begin() + b * T_);
  }
  if (++position_ == static_cast<uint64_t>(batches_per_epoch_)) start_epoch(epoch_ + 1);
}

LoaderState DataLoader::state() const {
  LoaderState s;
  s.epoch = epoch_;
  s.position = position_;
  s.seed = seed_;
  s.global_rows = static_cast<int64_t>(world_) * B_;
  s.seq_len = T_;
  s.num_tokens = shard_.size();
  return s;
}

Status DataLoader::restore(const LoaderState& s) {
  const std::string what = "cannot restore the data loader of '" + shard_.path() + "'";
  const std::string hint =
      "resume with the token file, sequence length, global batch (world*B) and seed of the "
      "run that saved the checkpoint";
  if (s.num_tokens != shard_.size()) {
    return error(what + ": the saved state is for a file of " + std::to_string(s.num_tokens) +
                     " tokens, this one has " + std::to_string(shard_.size()) +
                     " (re-tokenized or a different file?)",
                 hint);
  }
  const int64_t rows = static_cast<int64_t>(world_) * B_;
  if (s.seq_len != T_ || s.global_rows != rows) {
    return error(what + ": the saved state is for global batches of " +
                     shape_text(s.global_rows, s.seq_len) + ", this loader makes " +
                     shape_text(rows, T_),
                 hint);
  }
  if (s.seed != seed_) {
    return error(what + ": the saved state is for seed " + std::to_string(s.seed) +
                     ", this loader has seed " + std::to_string(seed_),
                 hint);
  }
  if (s.position >= static_cast<uint64_t>(batches_per_epoch_)) {
    return error(what + ": saved position " + std::to_string(s.position) +
                     " is past the end of an epoch of " + std::to_string(batches_per_epoch_) +
                     " batches",
                 "the checkpoint's loader state is corrupt; " + hint);
  }
  if (s.epoch != epoch_) start_epoch(s.epoch);
  position_ = s.position;
  return Status();
}

}  // namespace tessera
