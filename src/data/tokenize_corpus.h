// Turns a UTF-8 text file into train/val token shards for the DataLoader.
//
//   TS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load("data/gpt2"));  // or a tokenizer.json
//   TS_RETURN_IF_ERROR(tokenize_corpus("data/corpus/moby_dick.txt", "data/corpus",
//                                      /*val_fraction=*/0.1, tok));
//   // -> data/corpus/train.bin (first 90% of the tokens), data/corpus/val.bin (last 10%)
//
// Documents: the text is split at every literal "<|endoftext|>" (the separator of GPT-2
// style text dumps such as OpenWebText or TinyStories); a file without one is a single
// document. Each document loses its leading and trailing line breaks, empty documents are
// dropped, and every document is preceded by the tokenizer's document_start() token, as in
// GPT-2's and llm.c's training data: [EOT] doc1 [EOT] doc2 ... (Llama: <s> or
// <|begin_of_text|> before each document).
//
// Chunks: documents are encoded in chunks of about 1 MiB cut only where the tokenizer allows
// (Tokenizer::can_cut_before; split_for_encoding), so the ids equal those of encoding each
// document whole.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "data/tokenizer.h"

namespace tessera {

// Fails naming the file when text_path cannot be read, out_dir cannot be created or
// written, val_fraction is outside [0, 1), or the text yields no training tokens. Logs the
// document, token and byte counts.
Status tokenize_corpus(const std::string& text_path, const std::string& out_dir,
                       double val_fraction, const Tokenizer& tokenizer);

// Splits `text` into pieces of about `target_bytes` (longer where no cut point is near).
// Cuts only where tokenizer.can_cut_before() (for GPT-2: just before a '\n' that follows a
// printable ASCII character), so encoding the first piece and then the others as
// continuations gives exactly the ids of encoding `text` whole. The pieces concatenate to
// `text`.
std::vector<std::string_view> split_for_encoding(std::string_view text, size_t target_bytes,
                                                 const Tokenizer& tokenizer);

// The documents of a corpus text, split and trimmed as described above.
std::vector<std::string_view> split_documents(std::string_view text);

}  // namespace tessera
