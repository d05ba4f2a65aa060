// Byte-pair-encoding tokenizers: GPT-2's, and Hugging Face tokenizer.json files of the BPE
// kind: byte-level with GPT-2's or Llama 3's pre-tokenization regex (GPT-2, Llama 3 and 3.1;
// other regexes, as Qwen2's or Mistral-Nemo's, are refused by name), and SentencePiece-style
// with byte fallback (Llama 2, Mistral 7B, Mixtral).
//
//   TS_ASSIGN_OR_RETURN(Tokenizer gpt2, Tokenizer::load("data/gpt2"));   // encoder.json+vocab.bpe
//   TS_ASSIGN_OR_RETURN(Tokenizer l3, Tokenizer::load("Meta-Llama-3-8B"));  // its tokenizer.json
//   std::vector<int32_t> ids = gpt2.encode("Hello, world!");  // {15496, 11, 995, 0}
//   std::string text = gpt2.decode(ids);                        // "Hello, world!"
//
// encode() is what the tokenizer's own library gives for ordinary text without special
// tokens: the normalizer (SentencePiece's "▁" for spaces), the pre-tokenization regex
// (pretokenizer.h), then the merges lowest rank first within each piece (byte fallback for
// characters a SentencePiece vocabulary lacks). Special tokens are never produced from
// text: "<|endoftext|>" or "</s>" in a corpus encode as the characters they are; documents
// are delimited by ids (document_start()), never by text.
//
// Checked token for token against the reference encoders (tests/data/tokenizer_test.cc):
// gpt-3-encoder for GPT-2; llama3-tokenizer-js, llama-tokenizer-js and @huggingface/tokenizers
// for Llama 3's and Llama 2's vocabularies (tools/make_hf_tokenizers.mjs).
//
// Byte-level tokenizers encode any bytes, valid UTF-8 or not, and decode(encode(x)) == x.
// SentencePiece-style ones drop the leading "▁" they prepend when decoding, as theirs do.
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

// GPT-2's vocabulary (data/gpt2/), the one the shipped corpus is tokenized with.
inline constexpr int32_t kGpt2EndOfText = 50256;
inline constexpr int kGpt2VocabSize = 50257;

class Tokenizer {
 public:
  // `path`: a tokenizer.json, a directory holding one (a Hugging Face model folder), or a
  // directory holding GPT-2's encoder.json and vocab.bpe. A tokenizer_config.json beside a
  // tokenizer.json names its bos/eos tokens. Errors name the file, the key or line at fault,
  // and, for a tokenizer of a kind not supported (WordPiece, Unigram, an unknown normalizer
  // or pre-tokenization regex), what is.
  static Result<Tokenizer> load(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // `document_start`: false for a continuation of the text before it, cut where
  // can_cut_before() allows (SentencePiece-style tokenizers then prepend no "▁").
  std::vector<int32_t> encode(std::string_view text) const;
  void encode_append(std::string_view text, std::vector<int32_t>* out,
                     bool document_start = true) const;

  // The bytes of the tokens, concatenated (special tokens as their text). Not necessarily
  // valid UTF-8 when `ids` cuts a multi-byte character. `document_start`: the ids begin a
  // document (SentencePiece-style tokenizers then drop the space they prepended); false for
  // a continuation. An id outside the vocabulary (a model's padding rows) decodes as U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool document_start = true) const;
  const std::string& token_bytes(int32_t id) const;

  // Whether encoding text[0, pos) and then text[pos, end) as a continuation gives exactly the
  // ids of encoding the whole: the places a long document can be split for parallel or
  // bounded-memory encoding (always before a line break, '\n' or a CRLF's "\r\n", after a
  // character that ends any piece; SentencePiece-style: before a '\n' only).
  bool can_cut_before(std::string_view text, size_t pos) const;
  // The first such place in [from, end), or npos.
  size_t next_cut(std::string_view text, size_t from, size_t end) const;

  int vocab_size() const;  // ids are [0, vocab_size), special tokens included
  // The id that starts every document of a token stream: the tokenizer's beginning-of-text
  // token where it has one (Llama's <s>, <|begin_of_text|>), else its end-of-text token
  // (GPT-2's <|endoftext|>), as llm.c's and GPT-2's data lay documents out.
  int32_t document_start() const;
  int32_t eos() const;  // end of text (-1 where it has none)
  int32_t bos() const;  // beginning of text (-1 where it has none)
  // "gpt2", or the tokenizer.json's path.
  const std::string& name() const;
  // The file(s) it was read from (for a manifest, or to copy beside a checkpoint).
  const std::vector<std::string>& files() const;
  // Copies a tokenizer.json's files (and tokenizer_config.json) into `dir`; nothing for GPT-2's.
  Status copy_to(const std::string& dir) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  friend Result<Tokenizer> load_gpt2_tokenizer(const std::string& dir);
  friend Result<Tokenizer> load_hf_tokenizer(const std::string& json_path);
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) const;

  std::unique_ptr<Impl> impl_;
};

// The tokenizer.json in `dir` or in one of its `levels` parent folders (a checkpoint step
// inside a run: step-N, checkpoints/, the run), or "".
std::string find_tokenizer_near(const std::string& dir, int levels = 2);

// The loaders behind Tokenizer::load (tokenizer_load.cc).
Result<Tokenizer> load_gpt2_tokenizer(const std::string& dir);
Result<Tokenizer> load_hf_tokenizer(const std::string& json_path);

}  // namespace tessera
