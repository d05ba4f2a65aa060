// GPT-2's byte-level BPE tokenizer, byte-exact with GPT-2's encoder (the golden test checks
// it against the `gpt-3-encoder` npm package; see docs in data/gpt2/README.md).
//
//   TS_ASSIGN_OR_RETURN(Gpt2Tokenizer tok, Gpt2Tokenizer::load("data/gpt2"));
//   std::vector<int32_t> ids = tok.encode("Hello, world!");  // {15496, 11, 995, 0}
//   std::string text = tok.decode(ids);                        // "Hello, world!"
//   ids.push_back(Gpt2Tokenizer::kEndOfText);                  // documents are separated
//                                                              // by this id, never by text
//
// encode() splits the text with GPT-2's pre-tokenization regex (gpt2_pretokenizer.h), maps
// each piece's UTF-8 bytes to their byte tokens and applies the 50,000 merges of vocab.bpe
// lowest rank first. The literal text "<|endoftext|>" is encoded as ordinary text, as in
// GPT-2's encoder; append kEndOfText yourself. Any bytes encode, valid UTF-8 or not, and
// decode(encode(x)) == x for every x.
//
// A tokenizer is safe to use from several threads (its piece cache takes a lock).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera {

class Gpt2Tokenizer {
 public:
  static constexpr int32_t kEndOfText = 50256;
  static constexpr int kVocabSize = 50257;
  static constexpr int kNumMerges = 50000;

  // Reads `dir`/encoder.json and `dir`/vocab.bpe (GPT-2's files; the repo ships them in
  // data/gpt2/). Fails naming the directory and the missing or corrupt file (and the line
  // or key at fault) when a file is absent, unparsable or not GPT-2's vocabulary.
  static Result<Gpt2Tokenizer> load(const std::string& dir);

  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;
  ~Gpt2Tokenizer();

  std::vector<int32_t> encode(std::string_view text) const;
  // Appends the ids of `text` to *out (no allocation per call beyond *out's growth).
  void encode_append(std::string_view text, std::vector<int32_t>* out) const;

  // The bytes of the tokens, concatenated. Not necessarily valid UTF-8 when `ids` cuts a
  // multi-byte character (GPT-2's Python decoder would substitute U+FFFD there; this one
  // keeps the bytes so that decoding a stream piece by piece loses nothing).
  // TS_CHECKs that every id is in [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids) const;

  // The raw bytes of one token (e.g. " world" for 995).
  const std::string& token_bytes(int32_t id) const;

  int vocab_size() const { return kVocabSize; }

 private:
  struct Impl;
  explicit Gpt2Tokenizer(std::unique_ptr<Impl> impl);
  // BPE of one pre-token, appended to *out.
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) const;

  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
