// Token shards: a flat file of token ids with a small header, written atomically and
// validated on open.
//
//   TS_RETURN_IF_ERROR(write_token_shard("data/corpus/train.bin", ids, tok.vocab_size()));
//   TS_ASSIGN_OR_RETURN(TokenShard shard, TokenShard::open("data/corpus/train.bin", 50257));
//   int32_t first = shard[0];
//   shard.read(/*start=*/100, /*count=*/T + 1, buf.data());
//
// Layout (all integers little-endian), 32-byte header then the tokens:
//   offset  0  char[8]  magic "TSTOK\0\0\0"
//   offset  8  uint32   format version (kTokenShardVersion)
//   offset 12  uint32   bytes per token: 2 (uint16) when the vocab has <= 65536 ids, else 4
//   offset 16  uint64   number of tokens N
//   offset 24  uint32   vocab size of the tokenizer that wrote it
//   offset 28  uint32   reserved, 0
//   offset 32  N tokens of 2 or 4 bytes; the file is exactly 32 + N * bytes long.
//
// TokenShard::open also reads llm.c's shards as they are (its dev/data/data_common.py): a
// header of 256 little-endian int32 — magic 20240520, version (1: uint16 tokens, GPT-2's;
// 2: uint32, LLaMA 3's), the token count N — then the N tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"

namespace tessera {

inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeaderBytes = 32;

// Writes `tokens` to `path` atomically: into a temporary file in the same directory,
// fsync'd, then renamed over `path`, so a reader sees the old file or the complete new one
// and a failure leaves no partial file behind. Fails (naming the path and the cause) when
// the directory is missing or unwritable, or a token is outside [0, vocab_size).
Status write_token_shard(const std::string& path, std::span<const int32_t> tokens, int vocab_size);

// A read-only, memory-mapped token shard. Move-only.
class TokenShard {
 public:
  // Opens and validates `path`: magic, version, token width, file length against the token
  // count, and every id < vocab_size. Errors name the file, the offending value (for a bad
  // id: its index and byte offset) and how to fix it.
  static Result<TokenShard> open(const std::string& path, int vocab_size);

  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  ~TokenShard();

  int64_t size() const { return num_tokens_; }
  int bytes_per_token() const { return bytes_per_token_; }
  const std::string& path() const { return path_; }

  int32_t operator[](int64_t i) const;  // TS_CHECKs 0 <= i < size()
  // Copies tokens [start, start + count) to out[0, count); TS_CHECKs the range.
  void read(int64_t start, int64_t count, int32_t* out) const;

 private:
  TokenShard() = default;
  void release();

  std::string path_;
  void* map_ = nullptr;  // the whole file, or null for an empty shard
  size_t map_bytes_ = 0;
  const unsigned char* data_ = nullptr;  // first token
  int64_t num_tokens_ = 0;
  int bytes_per_token_ = 2;
};

}  // namespace tessera
