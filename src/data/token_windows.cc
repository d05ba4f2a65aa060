#include "data/token_windows.h"

#include <algorithm>

#include "base/check.h"
#include "models/model.h"

namespace tessera {
namespace {

int64_t windows_in(const TokenShard& shard, int T) {
  return shard.size() > 0 ? (shard.size() - 1) / T : 0;
}

}  // namespace

Result<TokenWindows> TokenWindows::open(const std::vector<std::string>& paths, int vocab_size,
                                        int T) {
  if (paths.empty()) return error("data loader: no token shards given");
  if (T < 1) return error("data loader: sequence length T=" + std::to_string(T) + " is not >= 1");
  TokenWindows w;
  w.T_ = T;
  for (const std::string& p : paths) {
    TS_ASSIGN_OR_RETURN(TokenShard shard, TokenShard::open(p, vocab_size));
    w.first_window_.push_back(w.total_windows_);
    w.total_windows_ += windows_in(shard, T);
    w.shards_.push_back(std::move(shard));
  }
  return w;
}

int64_t TokenWindows::num_tokens() const {
  int64_t n = 0;
  for (const TokenShard& s : shards_) n += s.size();
  return n;
}

void TokenWindows::read(int64_t w, int32_t* out) const {
  TS_CHECK(w >= 0 && w < size()) << "window " << w << " of " << size();
  // The shard holding window w: the last one whose first window is at most w.
  const size_t s = static_cast<size_t>(
      std::upper_bound(first_window_.begin(), first_window_.end(), w) - first_window_.begin() - 1);
  shards_[s].read((w - first_window_[s]) * T_, T_ + 1, out);
}

std::string TokenWindows::what() const {
  if (shards_.empty()) return "(no shards)";
  return shards_[0].path() + (shards_.size() > 1
                                  ? " and " + std::to_string(shards_.size() - 1) + " more shards"
                                  : std::string());
}

void append_sequence_chunks(const std::vector<int32_t>& x, const std::vector<int32_t>& y, int B,
                            int T, int chunk, int chunks, bool zigzag, HostBatch* batch) {
  // The pieces of each row this rank takes: its chunk, or its two zigzag halves.
  const int64_t len = zigzag ? T / (2 * chunks) : T / chunks;
  std::vector<int64_t> firsts = {chunk * len};
  if (zigzag) firsts.push_back((2 * chunks - 1 - chunk) * len);
  for (int b = 0; b < B; ++b)
    for (int64_t first : firsts) {
      const size_t at = static_cast<size_t>(int64_t{b} * T + first);
      batch->append(kTokensInput, x.data() + at, static_cast<size_t>(len));
      batch->append(kTargetsInput, y.data() + at, static_cast<size_t>(len));
    }
}

Status check_sequence_chunk(int T, int index, int chunks, bool zigzag) {
  const int pieces = zigzag ? 2 * chunks : chunks;
  if (chunks < 1 || index < 0 || index >= chunks || T % pieces != 0)
    return error("sequences of " + std::to_string(T) + " tokens do not split into " +
                     std::to_string(pieces) + " context-parallel " +
                     (zigzag ? "halves" : "chunks") + " (chunk " + std::to_string(index) + ")",
                 "use a --seq that is a multiple of " + std::to_string(pieces));
  return Status();
}

}  // namespace tessera
