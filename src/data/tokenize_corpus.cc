#include "data/tokenize_corpus.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/format.h"
#include "base/log.h"
#include "data/token_shards.h"

namespace tessera {
namespace {

constexpr std::string_view kEndOfTextText = "<|endoftext|>";
constexpr size_t kChunkBytes = size_t{1} << 20;

bool is_line_break(char c) { return c == '\n' || c == '\r'; }

// The offset of the first byte of `text` that is not part of well-formed UTF-8 (overlong
// forms, surrogates and code points past U+10FFFF included), or npos.
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

// A split needs one input token and its target.
constexpr int64_t kMinSplitTokens = 2;

}  // namespace

std::vector<std::string_view> split_for_encoding(std::string_view text, size_t target_bytes,
                                                 const Tokenizer& tokenizer) {
  std::vector<std::string_view> chunks;
  size_t start = 0;
  while (text.size() - start > target_bytes) {
    // The first safe cut at or after start + target_bytes; none left -> one last chunk.
    size_t cut = start + std::max<size_t>(target_bytes, 1);
    while (cut < text.size() && !tokenizer.can_cut_before(text, cut)) {
      cut = text.find('\n', cut + 1);
      if (cut == std::string_view::npos) cut = text.size();
    }
    if (cut >= text.size()) break;
    chunks.push_back(text.substr(start, cut - start));
    start = cut;
  }
  if (start < text.size()) chunks.push_back(text.substr(start));
  return chunks;
}

std::vector<std::string_view> split_documents(std::string_view text) {
  std::vector<std::string_view> docs;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(kEndOfTextText, start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view doc = text.substr(start, end - start);
    while (!doc.empty() && is_line_break(doc.front())) doc.remove_prefix(1);
    while (!doc.empty() && is_line_break(doc.back())) doc.remove_suffix(1);
    if (!doc.empty()) docs.push_back(doc);
    start = end + kEndOfTextText.size();
  }
  return docs;
}

Status tokenize_corpus(const std::string& text_path, const std::string& out_dir,
                       double val_fraction, const Tokenizer& tokenizer) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    return error("tokenize: val_fraction " + std::to_string(val_fraction) + " is outside [0, 1)",
                 "pass e.g. 0.1 to keep the last 10% of the tokens for validation");
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(text_path, ec)) {
    return error("tokenize: text file '" + text_path + "' does not exist or is not a file",
                 "pass the path of a UTF-8 text file, e.g. data/corpus/moby_dick.txt");
  }
  std::ifstream in(text_path, std::ios::binary);
  if (!in) {
    return error("tokenize: cannot read '" + text_path + "'", "check the file's permissions");
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  std::string text = std::move(buffer).str();
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);  // a byte-order mark is no text
  if (const size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    const bool gzip = text.size() >= 2 && static_cast<unsigned char>(text[0]) == 0x1f &&
                      static_cast<unsigned char>(text[1]) == 0x8b;
    const int64_t line = std::count(text.begin(), text.begin() + bad, '\n') + 1;
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(text[bad]));
    return error("tokenize: '" + text_path + "' is not UTF-8 text" +
                     (gzip ? " (it is gzip-compressed)"
                           : ": byte " + std::string(byte) + " at offset " + std::to_string(bad) +
                                 " (line " + std::to_string(line) + ") is not valid UTF-8"),
                 gzip ? "decompress it first: zcat " + text_path + " > " +
                            (text_path.size() > 3 && text_path.substr(text_path.size() - 3) == ".gz"
                                 ? text_path.substr(0, text_path.size() - 3)
                                 : text_path + ".txt")
                      : "pass a UTF-8 text file (convert others with iconv -t UTF-8)");
  }

  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string_view> docs = split_documents(text);
  std::vector<int32_t> tokens;
  tokens.reserve(text.size() / 4 + docs.size() + 1);
  for (std::string_view doc : docs) {
    tokens.push_back(tokenizer.document_start());
    bool first = true;
    for (std::string_view chunk : split_for_encoding(doc, kChunkBytes, tokenizer)) {
      tokenizer.encode_append(chunk, &tokens, first);
      first = false;
    }
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t num_val = static_cast<int64_t>(std::floor(val_fraction * total));
  const int64_t num_train = total - num_val;
  if (num_train <= 0 && num_val == 0) {
    return error("tokenize: '" + text_path + "' holds no text to tokenize (" +
                     std::to_string(total) + " tokens)",
                 "pass a non-empty UTF-8 text file");
  }
  if (num_train < kMinSplitTokens || (val_fraction > 0 && num_val < kMinSplitTokens)) {
    char frac[32];
    std::snprintf(frac, sizeof frac, "%g", val_fraction);
    const bool too_short = total < (val_fraction > 0 ? 2 : 1) * kMinSplitTokens;
    return error("tokenize: '" + text_path + "' gives " + format_count(total) +
                     " tokens: " + format_count(num_train) + " for training and " +
                     format_count(num_val) + " for validation (val fraction " + frac +
                     "); each split needs at least " + std::to_string(kMinSplitTokens),
                 too_short ? std::string("use a longer text")
                           : "use a --val-fraction that leaves both splits " +
                                 std::to_string(kMinSplitTokens) + " tokens or more");
  }
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    return error("tokenize: cannot create output directory '" + out_dir + "': " + ec.message(),
                 "choose a writable output directory");
  }
  std::span<const int32_t> all(tokens);
  const std::string train_path = (std::filesystem::path(out_dir) / "train.bin").string();
  const std::string val_path = (std::filesystem::path(out_dir) / "val.bin").string();
  TS_RETURN_IF_ERROR(write_token_shard(train_path, all.first(num_train), tokenizer.vocab_size()));
  TS_RETURN_IF_ERROR(write_token_shard(val_path, all.subspan(num_train), tokenizer.vocab_size()));
  TS_LOG(info) << "tokenized " << text_path << ": " << format_bytes(double(text.size())) << ", "
               << docs.size() << " document(s), " << format_count(total) << " tokens in "
               << format_duration(seconds) << " -> " << train_path << " ("
               << format_count(num_train) << "), " << val_path << " (" << format_count(num_val)
               << ")";
  return Status();
}

}  // namespace tessera
