// Private to tokenizer.cc and tokenizer_load.cc: what a loaded Tokenizer holds.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/pretokenizer.h"
#include "data/tokenizer.h"

namespace tessera {

struct TokenizerStringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

inline uint64_t bpe_pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Tokenizer::Impl {
  // How text becomes the symbols BPE merges.
  //   bytes: GPT-2's byte-level alphabet; each byte of a piece is a symbol.
  //   sentencepiece: spaces become "▁" (U+2581); each code point is a symbol, or its UTF-8
  //   bytes' <0xXX> tokens where the vocabulary lacks it (byte fallback).
  enum class Alphabet : uint8_t { bytes, sentencepiece };

  std::string name;
  std::vector<std::string> files;
  Alphabet alphabet = Alphabet::bytes;
  Pretokenizer pre = Pretokenizer::gpt2;
  bool add_prefix_space = false;          // bytes: a ' ' before a document not starting with one
  bool spm_prepend = false;               // sentencepiece: a "▁" before every document
  bool spm_prepend_unless_space = false;  // Metaspace: not before one that starts with ' '
  bool spm_split = false;                 // sentencepiece: a piece starts at every "▁"
  // sentencepiece: no token has a "▁" after another character, so no token spans the start
  // of a word and a piece may start at every "▁" that follows another character (exact,
  // and words are cached: Llama 2's vocabulary is so).
  bool spm_words = false;
  bool ignore_merges = false;  // a piece that is a token is that token
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool newline_is_barrier = false;  // sentencepiece: '\n' is a byte token no merge touches
  int32_t unk = -1, bos = -1, eos = -1;

  std::vector<std::string> token_bytes;  // id -> the bytes it decodes to
  // A symbol's spelling (bytes: its raw bytes; sentencepiece: its UTF-8 with "▁") -> id.
  std::unordered_map<std::string, int32_t, TokenizerStringHash, std::equal_to<>> id_of;
  std::array<int32_t, 256> byte_token{};  // bytes: a byte's token; sentencepiece: <0xXX> or -1
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  std::unordered_map<uint64_t, Merge> merges;  // bpe_pair_key(left, right) -> merge

  std::mutex cache_mu;
  std::unordered_map<std::string, std::vector<int32_t>, TokenizerStringHash, std::equal_to<>> cache;
};

}  // namespace tessera
