// A deterministic, resumable loader of (input, target) batches from a token shard, split
// across data-parallel ranks.
//
//   TS_ASSIGN_OR_RETURN(DataLoader loader,
//                       DataLoader::open("data/corpus/train.bin", 50257, /*B=*/8, /*T=*/256,
//                                        rank, world, /*seed=*/1234));
//   std::vector<int32_t> x, y;
//   loader.next(&x, &y);                        // x: (B, T) row-major; y: x shifted by one
//   nlohmann::json saved = loader.state();      // into the checkpoint
//   ...
//   TS_RETURN_IF_ERROR(loader.restore(saved.get<LoaderState>()));  // same batches again
//
// The shard is cut into W = (N - 1) / T windows; window w holds tokens [w*T, w*T + T + 1),
// its first T tokens are an input row and its last T the target row. A global batch is
// world*B windows; rank r gets rows [r*B, (r+1)*B) of it, so N ranks with batch B see
// exactly the batches of one rank with batch N*B. An epoch is W / (world*B) global batches
// (the remainder windows are skipped that epoch).
//
// Order: seed == 0 reads windows in file order (epoch after epoch the same); seed != 0
// shuffles the windows per epoch with a permutation derived only from (seed, epoch), so
// every rank computes the same one and a restored run continues identically.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "data/token_shards.h"

namespace tessera {

// Where a loader is; small, and saved with checkpoints. The fields after `position` record
// the run it belongs to, so restore() can refuse a state from another file or batch shape.
struct LoaderState {
  uint64_t epoch = 0;       // completed passes over the shard
  uint64_t position = 0;    // global batches already taken in this epoch
  uint64_t seed = 0;        // 0: sequential order
  int64_t global_rows = 0;  // world * B
  int64_t seq_len = 0;      // T
  int64_t num_tokens = 0;   // tokens in the shard
  bool operator==(const LoaderState&) const = default;
};

// nlohmann::json conversions: {"epoch": .., "position": .., "seed": .., "global_rows": ..,
// "seq_len": .., "num_tokens": ..}. from_json throws nlohmann::json::exception on a missing
// or mistyped key; loader_state_from_json returns an error instead.
void to_json(nlohmann::json& j, const LoaderState& state);
void from_json(const nlohmann::json& j, LoaderState& state);
Result<LoaderState> loader_state_from_json(const nlohmann::json& j);

class DataLoader {
 public:
  // Opens `path` (validated as in TokenShard::open) for rank `rank` of `world`, batch B rows
  // of T tokens per rank. Fails when B, T, rank or world are out of range, or the shard has
  // fewer than world*B*T + 1 tokens (too small for one global batch).
  static Result<DataLoader> open(const std::string& path, int vocab_size, int B, int T,
                                 int rank = 0, int world = 1, uint64_t seed = 0);

  // Fills inputs and targets with the next (B, T) batch of this rank and advances.
  void next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets);

  LoaderState state() const;
  // Continues from `state`, which must come from a loader over the same shard (token count)
  // with the same T, world*B and seed; world itself may differ. Fails otherwise, or when
  // its position is past the end of an epoch, leaving this loader unchanged.
  Status restore(const LoaderState& state);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t num_windows() const { return num_windows_; }
  const TokenShard& shard() const { return shard_; }

 private:
  DataLoader(TokenShard shard, int B, int T, int rank, int world, uint64_t seed);
  void start_epoch(uint64_t epoch);  // builds order_ for `epoch`
  int64_t window_of(int64_t row) const;

  TokenShard shard_;
  int B_;
  int T_;
  int rank_;
  int world_;
  uint64_t seed_;
  int64_t num_windows_;
  int64_t batches_per_epoch_;
  uint64_t epoch_ = 0;
  uint64_t position_ = 0;
  std::vector<int64_t> order_;  // (num_windows_) window order of this epoch; empty if seed 0
};

}  // namespace tessera
