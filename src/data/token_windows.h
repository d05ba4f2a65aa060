// The windows of T + 1 tokens that token shards are cut into, shared by the loaders of one
// folder (DataLoader) and of a weighted mixture of folders (MixtureLoader).
//
//   TS_ASSIGN_OR_RETURN(TokenWindows w, TokenWindows::open(files.train, vocab, /*T=*/1024));
//   std::vector<int32_t> window(T + 1);
//   w.read(17, window.data());  // window 17: its first T tokens an input row, its last T the
//                               // target row
//
// Each shard is cut on its own into (N - 1) / T windows (window k holds tokens [k*T, k*T +
// T + 1), so consecutive windows share a token); the shards' windows are numbered in order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "data/batch_stream.h"
#include "data/token_shards.h"

namespace tessera {

class TokenWindows {
 public:
  // Opens and validates every shard (TokenShard::open). Fails on no shards or T < 1.
  static Result<TokenWindows> open(const std::vector<std::string>& paths, int vocab_size, int T);

  int64_t size() const { return first_window_.empty() ? 0 : total_windows_; }
  int64_t num_tokens() const;  // over every shard
  int T() const { return T_; }
  // Copies window w's T + 1 tokens to out; TS_CHECKs 0 <= w < size().
  void read(int64_t w, int32_t* out) const;
  // The first shard, and how many more ("a.bin and 3 more shards").
  std::string what() const;

 private:
  std::vector<TokenShard> shards_;
  std::vector<int64_t> first_window_;  // of each shard
  int64_t total_windows_ = 0;
  int T_ = 1;
};

// Appends rows x, y (B rows of T tokens) to the batch's "tokens" and "targets": of each row
// only chunk `chunk` of `chunks` (context parallelism), or its two zigzag halves.
void append_sequence_chunks(const std::vector<int32_t>& x, const std::vector<int32_t>& y, int B,
                            int T, int chunk, int chunks, bool zigzag, HostBatch* batch);

// Checks a context-parallel split of T: 0 <= index < chunks and the chunks (halves) divide T.
Status check_sequence_chunk(int T, int index, int chunks, bool zigzag);

}  // namespace tessera
