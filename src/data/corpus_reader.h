// Reads the documents of a corpus as a stream of text pieces, in bounded memory whatever the
// input's size: text files, JSONL files, folders of them, and stdin, each optionally
// gzip-compressed.
//
//   TS_ASSIGN_OR_RETURN(CorpusReader reader,
//                       CorpusReader::open({"web/", "extra.jsonl.gz", "-"}, {}, tokenizer));
//   TextPiece piece;
//   while (true) {
//     TS_ASSIGN_OR_RETURN(bool more, reader.next(&piece));
//     if (!more) break;
//     // piece.text; piece.starts_document: the first piece of a document (else it continues
//     // the previous piece, cut where tokenizer.can_cut_before() allows)
//   }
//
// Formats (CorpusFormat; `auto` picks by the name, .gz aside: .jsonl/.ndjson are JSONL, all
// else text; stdin is text unless told):
//   text:  documents are separated by the literal "<|endoftext|>" (GPT-2-style dumps such as
//          OpenWebText or TinyStories); a file without one is one document. Each document
//          loses its leading and trailing line breaks; empty ones are dropped. A leading
//          byte-order mark is dropped.
//   jsonl: one JSON object per line; its string `field` (default "text") is a document,
//          as is. Blank lines are skipped; empty documents are dropped.
// A folder is read recursively in name order, taking the files whose names (less .gz) end in
// .txt, .text, .md, .jsonl or .ndjson. Errors name the file and the byte offset or line: text
// that is not UTF-8, a JSONL line that is not an object with a string `field`, a document with
// no place to cut it within kMaxPieceBytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "data/tokenizer.h"

namespace tessera {

enum class CorpusFormat { automatic, text, jsonl };

struct CorpusOptions {
  CorpusFormat format = CorpusFormat::automatic;
  std::string field = "text";
  size_t piece_bytes = size_t{1} << 20;  // a text document is cut into pieces of about this
};

struct TextPiece {
  std::string text;
  bool starts_document = true;
};

// What was read from one input file.
struct CorpusSource {
  std::string path;
  int64_t bytes = 0;  // read (uncompressed)
  int64_t documents = 0;
};

class CorpusReader {
 public:
  // A document longer than this with no place to cut it is refused (memory stays bounded).
  static constexpr size_t kMaxPieceBytes = size_t{256} << 20;

  // Expands `inputs` (files, folders, "-" for stdin) into the files to read. Fails naming an
  // input that does not exist, a folder with no readable file, or an empty input list.
  static Result<CorpusReader> open(const std::vector<std::string>& inputs,
                                   const CorpusOptions& options, const Tokenizer& tokenizer);
  CorpusReader(CorpusReader&&) noexcept;
  CorpusReader& operator=(CorpusReader&&) noexcept;
  ~CorpusReader();

  // The next piece; false when every input is read.
  Result<bool> next(TextPiece* piece);

  const std::vector<CorpusSource>& sources() const;  // those opened so far, with their counts

  struct State;

 private:
  explicit CorpusReader(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

// The offset of the first byte of `text` that is not well-formed UTF-8 (overlong forms,
// surrogates and code points past U+10FFFF included), or npos.
size_t first_invalid_utf8(std::string_view text);

}  // namespace tessera
