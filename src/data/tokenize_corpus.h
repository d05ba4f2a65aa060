// Turns a corpus (text or JSONL files, folders, stdin; corpus_reader.h) into token shards for
// the DataLoader, streaming: memory stays bounded whatever the corpus's size.
//
//   TS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load("data/gpt2"));  // or a tokenizer.json
//   TokenizeOptions o;
//   o.inputs = {"web/", "books.jsonl.gz"};
//   o.out = "data/web";
//   TS_ASSIGN_OR_RETURN(TokenizeSummary done, tokenize_to_shards(o, tok));
//   // data/web/train_000000.bin ... val.bin, manifest.json
//
// Layout: every document is preceded by the tokenizer's document_start() token, as in GPT-2's
// and llm.c's training data: [EOT] doc1 [EOT] doc2 ... (Llama: <s> or <|begin_of_text|>
// before each document). The stream is cut into shards of `shard_tokens`; the last
// `val_tokens` (or `val_fraction` of all) tokens are the validation split. A split of one
// shard is named train.bin / val.bin, of several train_000000.bin, train_000001.bin, ...
// (read in name order). manifest.json lists the shards (tokens, bytes, crc32), the sources
// (bytes, documents) and the tokenizer; find_token_shards checks the shards against it.
//
// Work: pieces of text are read in order, encoded on `threads` threads in batches, and
// appended in order, so the ids do not depend on the thread count. Documents are encoded in
// pieces of about 1 MiB cut only where the tokenizer allows (Tokenizer::can_cut_before;
// split_for_encoding), so the ids equal those of encoding each document whole. Peak memory:
// about 4 bytes x shard_tokens (one shard's buffer) + 8 MiB of text per thread, plus the
// longest document that has no place to cut it (JSONL: the longest line; text whose lines
// all end in punctuation for Llama 3, or in "\r\n" for a SentencePiece-style tokenizer,
// cannot be cut: at most CorpusReader::kMaxPieceBytes).
//
// Nothing half-written is left in `out`: shards are written into a staging folder inside it
// and moved in (replacing an earlier run's shards) only when all are complete.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "data/corpus_reader.h"
#include "data/tokenizer.h"

namespace tessera {

struct TokenizeOptions {
  std::vector<std::string> inputs;
  CorpusOptions corpus;
  std::string out;
  int64_t shard_tokens = 100'000'000;
  double val_fraction = 0.05;  // the last share of the tokens, unless val_tokens >= 0
  int64_t val_tokens = -1;
  int threads = 0;  // 0: every core
};

struct TokenizeSummary {
  int64_t bytes = 0, documents = 0, tokens = 0, train_tokens = 0, val_tokens = 0;
  double seconds = 0;
  int threads = 1;
  std::vector<std::string> train_shards, val_shards;  // paths, in order
};

// Fails naming the input, the bad value or the output folder: an unreadable or malformed
// input (corpus_reader.h), shard_tokens < 1, a val split outside [0, 1) or larger than the
// tokens, a split of fewer than 2 tokens, an unwritable `out`.
Result<TokenizeSummary> tokenize_to_shards(const TokenizeOptions& options,
                                           const Tokenizer& tokenizer);

// One text file into out_dir's train.bin and val.bin (the last val_fraction of the tokens):
// the shipped corpus's preparation.
Status tokenize_corpus(const std::string& text_path, const std::string& out_dir,
                       double val_fraction, const Tokenizer& tokenizer);

// Splits `text` into pieces of about `target_bytes` (longer where no cut point is near).
// Cuts only where tokenizer.can_cut_before() (for GPT-2: just before a '\n' that follows a
// printable ASCII character), so encoding the first piece and then the others as
// continuations gives exactly the ids of encoding `text` whole. The pieces concatenate to
// `text`.
std::vector<std::string_view> split_for_encoding(std::string_view text, size_t target_bytes,
                                                 const Tokenizer& tokenizer);

// The tokenizer.json a tokenized folder's manifest names, or "" (GPT-2's files, or a folder
// without a manifest, as llm.c's).
std::string data_tokenizer(const std::string& dir);

// What identifies the tokenizer of a tokenized folder's manifest ("gpt2|50257|50256", or
// "tokenizer.json|VOCAB|START|CRC" of its tokenizer.json), or "" without one.
std::string data_tokenizer_identity(const std::string& dir);

// Whether `name` is a shard name tokenize_to_shards writes (train.bin, val_000003.bin, ...).
bool is_tokenized_shard_name(const std::string& name);

}  // namespace tessera
