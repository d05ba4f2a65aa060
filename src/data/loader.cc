#include "data/loader.h"

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "models/model.h"

namespace tessera {
namespace {

std::string shape_text(int64_t rows, int64_t T) {
  return std::to_string(rows) + " rows x " + std::to_string(T) + " tokens";
}

}  // namespace

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
    : shard_(std::move(shard)),
      B_(B),
      T_(T),
      num_windows_((shard_.size() - 1) / T),
      order_(num_windows_, B, rank, world, seed) {}

void DataLoader::next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets) {
  TS_CHECK(inputs != nullptr && targets != nullptr);
  const size_t n = static_cast<size_t>(B_) * T_;
  inputs->resize(n);
  targets->resize(n);
  std::vector<int32_t> window(static_cast<size_t>(T_) + 1);
  std::vector<int64_t> windows;
  order_.next(&windows);
  for (int b = 0; b < B_; ++b) {
    shard_.read(windows[static_cast<size_t>(b)] * T_, T_ + 1, window.data());
    std::copy(window.begin(), window.end() - 1, inputs->begin() + b * T_);
    std::copy(window.begin() + 1, window.end(), targets->begin() + b * T_);
  }
}

void DataLoader::next(HostBatch* batch) {
  next(&x_, &y_);
  batch->append(kTokensInput, x_.data(), x_.size());
  batch->append(kTargetsInput, y_.data(), y_.size());
}

LoaderState DataLoader::state() const {
  LoaderState s;
  order_.fill(&s);
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
  const int64_t rows = order_.global_rows();
  if (s.seq_len != T_ || s.global_rows != rows) {
    return error(what + ": the saved state is for global batches of " +
                     shape_text(s.global_rows, s.seq_len) + ", this loader makes " +
                     shape_text(rows, T_),
                 hint);
  }
  return order_.restore(s, what, hint);
}

}  // namespace tessera
