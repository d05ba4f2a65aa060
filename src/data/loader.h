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
// its first T tokens are an input row and its last T the target row. Several shards (a
// folder of them, find_token_shards) are cut each on its own, their windows numbered in
// order. Windows are the examples of an ExampleOrder (data/batch_stream.h): world*B per
// global batch, shuffled per epoch unless seed == 0. As a BatchStream it fills "tokens" and
// "targets".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "data/batch_stream.h"
#include "data/token_shards.h"
#include "data/token_windows.h"

namespace tessera {

// The token shards of a data directory: those its manifest.json lists (`tessera tokenize`;
// each must be there with the listed size), else train.bin and val.bin, else every .bin
// whose name says "train" and every one that says "val" (llm.c's fineweb_train_000001.bin,
// ...), each split in name order. Errors name the directory, the file and what is wrong.
struct ShardFiles {
  std::vector<std::string> train, val;
};
Result<ShardFiles> find_token_shards(const std::string& dir);

class DataLoader : public BatchStream {
 public:
  // Opens `path` (validated as in TokenShard::open) for rank `rank` of `world`, batch B rows
  // of T tokens per rank. Fails when B, T, rank or world are out of range, or the shard has
  // fewer than world*B*T + 1 tokens (too small for one global batch).
  static Result<DataLoader> open(const std::string& path, int vocab_size, int B, int T,
                                 int rank = 0, int world = 1, uint64_t seed = 0);
  // The same over several shards, read as one (each shard's windows in turn).
  static Result<DataLoader> open(const std::vector<std::string>& paths, int vocab_size, int B,
                                 int T, int rank = 0, int world = 1, uint64_t seed = 0);

  // Fills inputs and targets with the next (B, T) batch of this rank and advances.
  void next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets);
  // The same, appended to the batch's "tokens" and "targets" (of each row only the sequence
  // chunk set_sequence_chunk chose: the whole row unless it was called).
  void next(HostBatch* batch) override;
  // Context parallelism: next(HostBatch*) gives chunk `index` of `chunks` equal chunks of every
  // row's T tokens (and of its targets), the chunk this rank's graph takes; with `zigzag`,
  // halves index and 2 chunks - 1 - index of 2 chunks (Plan::context_order). Fails unless
  // 0 <= index < chunks and the chunks (halves) divide T.
  Status set_sequence_chunk(int index, int chunks, bool zigzag = false);

  LoaderState state() const override;
  // Continues from `state`, which must come from a loader over the same shard (token count)
  // with the same T, world*B and seed; world itself may differ. Fails otherwise, or when
  // its position is past the end of an epoch, leaving this loader unchanged.
  Status restore(const LoaderState& state) override;

  int64_t batches_per_epoch() const { return order_.batches_per_epoch(); }
  int64_t num_windows() const { return windows_.size(); }
  int64_t num_tokens() const;  // over every shard

 private:
  DataLoader(TokenWindows windows, int B, int T, int rank, int world, uint64_t seed);

  TokenWindows windows_;
  int B_;
  int T_;
  ExampleOrder order_;
  std::vector<int32_t> x_, y_;  // next(HostBatch*)'s staging
  int chunk_ = 0, chunks_ = 1;  // set_sequence_chunk
  bool zigzag_ = false;
};

}  // namespace tessera
