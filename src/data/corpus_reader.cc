#include "data/corpus_reader.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSeparator = "<|endoftext|>";
constexpr size_t kReadBytes = size_t{1} << 20;

bool is_line_break(char c) { return c == '\n' || c == '\r'; }

// The name without a trailing .gz.
std::string plain_name(const std::string& path) {
  return path.ends_with(".gz") ? path.substr(0, path.size() - 3) : path;
}

CorpusFormat format_of(const std::string& path, CorpusFormat asked) {
  if (asked != CorpusFormat::automatic) return asked;
  const std::string name = plain_name(path);
  return name.ends_with(".jsonl") || name.ends_with(".ndjson") ? CorpusFormat::jsonl
                                                               : CorpusFormat::text;
}

bool is_corpus_file(const fs::path& p) {
  const std::string name = plain_name(p.filename().string());
  for (std::string_view ext : {".txt", ".text", ".md", ".jsonl", ".ndjson"})
    if (name.ends_with(ext)) return true;
  return false;
}

}  // namespace

size_t first_invalid_utf8(std::string_view text) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + len > n || b[i + 1] < lo || b[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (b[i + k] < 0x80 || b[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string_view::npos;
}

struct CorpusReader::State {
  CorpusOptions opt;
  const Tokenizer* tok = nullptr;
  std::vector<std::pair<std::string, CorpusFormat>> files;  // "-": stdin
  size_t next_file = 0;
  std::vector<CorpusSource> sources;

  // The file being read.
  gzFile gz = nullptr;
  CorpusFormat format = CorpusFormat::text;
  std::string buf;      // read, from file offset buf_offset
  size_t pos = 0;       // consumed up to here
  size_t sep_scan = 0;  // no separator starts before here (past pos)
  size_t cut_scan = 0;  // no place to cut before here (past pos + piece_bytes)
  int64_t buf_offset = 0;
  int64_t buf_line = 1;  // the line buf[0] is on
  bool eof = false;
  bool in_doc = false;  // a text document's first piece was given
  int64_t line = 0;     // JSONL lines consumed

  ~State() { close(); }
  void close() {
    if (gz != nullptr) gzclose(gz);
    gz = nullptr;
  }
  const std::string& path() const { return sources.back().path; }

  Status open_next() {
    const auto& [path, fmt] = files[next_file++];
    gz = path == "-" ? gzdopen(::dup(0), "rb") : gzopen(path.c_str(), "rb");
    if (gz == nullptr)
      return error("cannot read corpus file '" + path + "'",
                   "check that it exists and is readable");
    gzbuffer(gz, kReadBytes);
    format = fmt;
    buf.clear();
    pos = sep_scan = cut_scan = 0;
    buf_offset = 0;
    buf_line = 1;
    eof = in_doc = false;
    line = 0;
    sources.push_back({path == "-" ? "(stdin)" : path, 0, 0});
    return Status();
  }

  // Reads more of the file into buf, dropping what was consumed.
  Status fill() {
    if (pos > 0) {
      buf_line += std::count(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(pos), '\n');
      buf.erase(0, pos);
      buf_offset += static_cast<int64_t>(pos);
      sep_scan = sep_scan > pos ? sep_scan - pos : 0;
      cut_scan = cut_scan > pos ? cut_scan - pos : 0;
      pos = 0;
    }
    const size_t have = buf.size();
    buf.resize(have + kReadBytes);
    const int got = gzread(gz, buf.data() + have, static_cast<unsigned>(kReadBytes));
    int code = Z_OK;
    const char* what = gzerror(gz, &code);
    if (got < 0 || (code != Z_OK && code != Z_STREAM_END)) {
      buf.resize(have);
      return error("cannot read corpus file '" + path() + "' at byte " +
                       std::to_string(buf_offset + static_cast<int64_t>(have)) + ": " + what,
                   "a truncated or corrupt .gz? check the file (gzip -t)");
    }
    buf.resize(have + static_cast<size_t>(got));
    sources.back().bytes += got;
    if (got == 0) eof = true;
    if (buf_offset == 0 && have == 0 && buf.rfind("\xEF\xBB\xBF", 0) == 0) pos = 3;  // a BOM
    return Status();
  }

  // A text document's piece buf[from, to): trimmed, checked, given unless empty.
  Result<bool> text_piece(size_t from, size_t to, bool ends_document, TextPiece* piece) {
    if (!in_doc)
      while (from < to && is_line_break(buf[from])) ++from;
    if (ends_document)
      while (to > from && is_line_break(buf[to - 1])) --to;
    std::string_view text(buf.data() + from, to - from);
    if (const size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(text[bad]));
      const auto at = buf.begin() + static_cast<std::ptrdiff_t>(from + bad);
      const int64_t line_no = buf_line + std::count(buf.begin(), at, '\n');
      return error("corpus file '" + path() + "' is not UTF-8 text: byte " + byte + " at offset " +
                       std::to_string(buf_offset + int64_t(from + bad)) + " (line " +
                       std::to_string(line_no) + ") is not valid UTF-8",
                   "pass UTF-8 text (convert others with iconv -t UTF-8)");
    }
    const bool starts = !in_doc;
    in_doc = !ends_document && (in_doc || !text.empty());
    if (text.empty()) return false;
    piece->text.assign(text);
    piece->starts_document = starts;
    if (starts) ++sources.back().documents;
    return true;
  }

  Result<bool> next_text(TextPiece* piece) {
    while (true) {
      const size_t sep = buf.find(kSeparator, std::max(pos, sep_scan));
      if (sep == std::string::npos)
        sep_scan = std::max(pos, buf.size() - std::min(buf.size(), kSeparator.size() - 1));
      const size_t end = sep != std::string::npos ? sep : buf.size();
      const bool complete = sep != std::string::npos || eof;  // [pos, end) ends the document
      if (end - pos > opt.piece_bytes) {
        // The first place after piece_bytes where the document may be cut.
        const size_t cut = tok->next_cut(buf, std::max(pos + opt.piece_bytes, cut_scan), end);
        cut_scan = std::min(cut, end);  // searched up to here
        if (cut < end) {
          TS_ASSIGN_OR_RETURN(bool got, text_piece(pos, cut, false, piece));
          pos = cut;
          if (got) return true;
          continue;
        }
        if (!complete && end - pos > kMaxPieceBytes)
          return error("corpus file '" + path() + "': the document at offset " +
                           std::to_string(buf_offset + int64_t(pos)) + " runs " +
                           std::to_string(kMaxPieceBytes >> 20) +
                           " MiB with no line break where the tokenizer can cut it",
                       "split the text into documents (\"<|endoftext|>\" between them, or one "
                       "JSONL line each)");
      }
      if (complete) {
        if (pos >= buf.size() && eof) return false;
        TS_ASSIGN_OR_RETURN(bool got, text_piece(pos, end, true, piece));
        pos = end + (sep != std::string::npos ? kSeparator.size() : 0);
        sep_scan = std::max(sep_scan, pos);
        if (got) return true;
        continue;
      }
      TS_RETURN_IF_ERROR(fill());
    }
  }

  Result<bool> next_jsonl(TextPiece* piece) {
    while (true) {
      size_t nl = buf.find('\n', pos);
      if (nl == std::string::npos && !eof) {
        if (buf.size() - pos > kMaxPieceBytes)
          return error("corpus file '" + path() + "': line " + std::to_string(line + 1) +
                           " is longer than " + std::to_string(kMaxPieceBytes >> 20) + " MiB",
                       "is it JSONL (one JSON object per line)?");
        TS_RETURN_IF_ERROR(fill());
        continue;
      }
      if (nl == std::string::npos && pos >= buf.size()) return false;
      const size_t end = nl == std::string::npos ? buf.size() : nl;
      std::string_view row(buf.data() + pos, end - pos);
      pos = nl == std::string::npos ? buf.size() : nl + 1;
      ++line;
      if (row.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const std::string where = "corpus file '" + path() + "' line " + std::to_string(line);
      nlohmann::json doc;
      try {
        doc = nlohmann::json::parse(row);
      } catch (const nlohmann::json::exception& e) {  // syntax, or a number out of range
        return error(where + " is not JSON: " + e.what(),
                     "pass JSONL (one JSON object per line), or --format text for plain text");
      }
      if (!doc.is_object() || !doc.contains(opt.field) || !doc[opt.field].is_string()) {
        std::string keys;
        if (doc.is_object())
          for (const auto& [k, v] : doc.items()) keys += (keys.empty() ? "" : ", ") + k;
        return error(where + " has no string field \"" + opt.field + "\"" +
                         (doc.is_object() ? " (its fields: " + keys + ")" : " (not an object)"),
                     "name the field that holds the text with --field");
      }
      piece->text = doc[opt.field].get<std::string>();
      if (piece->text.empty()) continue;
      piece->starts_document = true;
      ++sources.back().documents;
      return true;
    }
  }
};

CorpusReader::CorpusReader(std::unique_ptr<State> state) : s_(std::move(state)) {}
CorpusReader::CorpusReader(CorpusReader&&) noexcept = default;
CorpusReader& CorpusReader::operator=(CorpusReader&&) noexcept = default;
CorpusReader::~CorpusReader() = default;

Result<CorpusReader> CorpusReader::open(const std::vector<std::string>& inputs,
                                        const CorpusOptions& options, const Tokenizer& tokenizer) {
  if (inputs.empty())
    return error("no corpus input given", "pass --input with text or JSONL files, folders or -");
  if (options.field.empty()) return error("the JSONL field name is empty", "pass --field NAME");
  auto s = std::make_unique<State>();
  s->opt = options;
  s->tok = &tokenizer;
  int stdin_inputs = 0;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (in == "-") {
      if (++stdin_inputs > 1) return error("stdin (-) is given as an input twice");
      s->files.emplace_back(
          in, options.format == CorpusFormat::jsonl ? CorpusFormat::jsonl : CorpusFormat::text);
    } else if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (fs::recursive_directory_iterator it(in, ec), end; !ec && it != end; it.increment(ec))
        if (it->is_regular_file() && is_corpus_file(it->path()))
          found.push_back(it->path().string());
      if (ec) return error("cannot list corpus folder '" + in + "': " + ec.message());
      if (found.empty())
        return error("corpus folder '" + in +
                         "' holds no .txt, .text, .md, .jsonl or .ndjson "
                         "file (plain or .gz)",
                     "pass the folder that holds the corpus files, or the files themselves");
      std::sort(found.begin(), found.end());
      for (std::string& f : found) s->files.emplace_back(f, format_of(f, options.format));
    } else if (fs::exists(in, ec)) {
      s->files.emplace_back(in, format_of(in, options.format));
    } else {
      return error("corpus input '" + in + "' does not exist",
                   "pass text or JSONL files, folders of them, or - for stdin");
    }
  }
  return CorpusReader(std::move(s));
}

Result<bool> CorpusReader::next(TextPiece* piece) {
  while (true) {
    if (s_->gz == nullptr) {
      if (s_->next_file == s_->files.size()) return false;
      TS_RETURN_IF_ERROR(s_->open_next());
    }
    TS_ASSIGN_OR_RETURN(
        bool got, s_->format == CorpusFormat::jsonl ? s_->next_jsonl(piece) : s_->next_text(piece));
    if (got) return true;
    s_->close();
  }
}

const std::vector<CorpusSource>& CorpusReader::sources() const { return s_->sources; }

}  // namespace tessera
