// Hugging Face tokenizer.json: GPT-2's vocabulary written as one (always), Llama 3's and
// Llama 2's real vocabularies against their reference encoders (when scripts/
// make_tokenizers.sh has written them into the build tree: they are Meta's and not
// committed), a small SentencePiece-style tokenizer built here, and the refusals.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/pretokenizer.h"
#include "data/tokenize_corpus.h"
#include "data/tokenizer.h"
#include "data_test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using testing_util::kRepo;
using testing_util::read_bytes;
using testing_util::repo_tokenizer;
using testing_util::ScratchDir;
using testing_util::write_bytes;

const json& golden() {
  static const json g =
      json::parse(read_bytes(kRepo + "/tests/data/golden/hf_tokenizer_golden.json"));
  return g;
}

// GPT-2's encoder.json and vocab.bpe as a tokenizer.json, with `pre_tokenizer`.
json gpt2_tokenizer_json(const json& pre_tokenizer) {
  json vocab = json::parse(read_bytes(kRepo + "/data/gpt2/encoder.json"));
  json merges = json::array();
  std::istringstream lines(read_bytes(kRepo + "/data/gpt2/vocab.bpe"));
  std::string line;
  while (std::getline(lines, line))
    if (!line.empty() && line[0] != '#') merges.push_back(line);
  return {{"version", "1.0"},
          {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

Tokenizer load_json(const ScratchDir& dir, const json& j) {
  write_bytes(dir.file("tokenizer.json"), j.dump());
  auto r = Tokenizer::load(dir.path());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) std::abort();
  return std::move(r).value();
}

TEST(HfTokenizer, Gpt2AsTokenizerJsonEncodesLikeGpt2sOwnFiles) {
  const std::string text = read_bytes(kRepo + "/data/corpus/moby_dick.txt").substr(0, 60000) +
                           golden()["texts"][19]["text"].get<std::string>();
  const std::vector<int32_t> want = repo_tokenizer().encode(text);
  // The ByteLevel pre-tokenizer's own regex, and the same regex spelled as a Split.
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  const json split = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern",
          {{"Regex",
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  for (const json& pre : {byte_level, split}) {
    ScratchDir dir;
    Tokenizer tok = load_json(dir, gpt2_tokenizer_json(pre));
    EXPECT_EQ(tok.vocab_size(), kGpt2VocabSize);
    EXPECT_EQ(tok.eos(), kGpt2EndOfText);
    EXPECT_EQ(tok.document_start(), kGpt2EndOfText);
    EXPECT_EQ(tok.encode(text), want) << pre.dump();
    EXPECT_EQ(tok.decode(want), text);
  }
  // add_prefix_space: a document gets a leading space, a continuation does not.
  ScratchDir dir;
  json prefixed = byte_level;
  prefixed["add_prefix_space"] = true;
  Tokenizer tok = load_json(dir, gpt2_tokenizer_json(prefixed));
  EXPECT_EQ(tok.encode("Hello"), repo_tokenizer().encode(" Hello"));
  std::vector<int32_t> cont;
  tok.encode_append("Hello", &cont, /*document_start=*/false);
  EXPECT_EQ(cont, repo_tokenizer().encode("Hello"));
}

TEST(Llama3Pretokenizer, SplitsLikeTheJsRegexOfLlama3TokenizerJs) {
  for (const json& t : golden()["texts"]) {
    const std::string text = t["text"];
    std::vector<std::string> got;
    for (std::string_view p : pretokenize(Pretokenizer::llama3, text)) got.emplace_back(p);
    EXPECT_EQ(got, t["llama3_pieces"].get<std::vector<std::string>>()) << text;
  }
  auto pieces = [](std::string_view s) {
    std::vector<std::string> out;
    for (std::string_view p : pretokenize(Pretokenizer::llama3, s)) out.emplace_back(p);
    return out;
  };
  // Case-insensitive contractions, numbers in threes, symbols keeping their line breaks,
  // whitespace up to the last line break.
  EXPECT_EQ(pieces("I'M 12345"), (std::vector<std::string>{"I", "'M", " ", "123", "45"}));
  EXPECT_EQ(pieces("x.\n\ny"), (std::vector<std::string>{"x", ".\n\n", "y"}));
  EXPECT_EQ(pieces("a  \n \n  b"), (std::vector<std::string>{"a", "  \n \n", " ", " b"}));
  EXPECT_EQ(pieces("\tword"), (std::vector<std::string>{"\tword"}));
  EXPECT_EQ(pieces("\nword"), (std::vector<std::string>{"\n", "word"}));
}

// The Meta vocabularies written by scripts/make_tokenizers.sh, or null (the test skips).
std::optional<Tokenizer> meta_tokenizer(const std::string& name) {
  const std::string dir = std::string(TESSERA_BINARY_DIR) + "/tokenizers/" + name;
  if (!std::filesystem::exists(dir + "/tokenizer.json")) return std::nullopt;
  auto r = Tokenizer::load(dir);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return std::nullopt;
  return std::move(r).value();
}

#define SKIP_WITHOUT(tok, name)                                                                 \
  if (!tok)                                                                                     \
  GTEST_SKIP() << name << "'s tokenizer.json is not in " TESSERA_BINARY_DIR "/tokenizers "      \
               << "(scripts/make_tokenizers.sh writes it from the npm packages; it needs node " \
                  "and npm)"

TEST(HfTokenizer, Llama3MatchesLlama3TokenizerJsOnHeldOutText) {
  std::optional<Tokenizer> tok = meta_tokenizer("llama3");
  SKIP_WITHOUT(tok, "Llama 3");
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->bos(), 128000);
  EXPECT_EQ(tok->eos(), 128001);
  EXPECT_EQ(tok->document_start(), 128000);
  size_t ids = 0;
  for (const json& t : golden()["texts"]) {
    const std::string text = t["text"];
    EXPECT_EQ(tok->encode(text), t["llama3"].get<std::vector<int32_t>>()) << text;
    EXPECT_EQ(tok->decode(tok->encode(text)), text);
    ids += t["llama3"].size();
  }
  EXPECT_GT(ids, 500u);
  // Special tokens are never made from text.
  EXPECT_EQ(tok->decode(tok->encode("<|end_of_text|>")), "<|end_of_text|>");
  EXPECT_GT(tok->encode("<|end_of_text|>").size(), 1u);
}

TEST(HfTokenizer, Llama2MatchesLlamaTokenizerJsOnHeldOutText) {
  std::optional<Tokenizer> tok = meta_tokenizer("llama2");
  SKIP_WITHOUT(tok, "Llama 2");
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  for (const json& t : golden()["texts"]) {
    const std::string text = t["text"];
    EXPECT_EQ(tok->encode(text), t["llama2"].get<std::vector<int32_t>>()) << text;
    EXPECT_EQ(tok->decode(tok->encode(text)), text);
  }
}

TEST(HfTokenizer, CutDocumentsEncodeAsWholeOnes) {
  const std::string text = read_bytes(kRepo + "/data/corpus/moby_dick.txt").substr(30000, 20000) +
                           golden()["texts"][13]["text"].get<std::string>() +
                           golden()["texts"][14]["text"].get<std::string>() + "x.\n\nEnd\n";
  std::string crlf;  // the same with CRLF line ends (Llama 3 cuts before them too)
  for (char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  for (const char* name : {"llama3", "llama2"}) {
    std::optional<Tokenizer> tok = meta_tokenizer(name);
    SKIP_WITHOUT(tok, name);
    for (const std::string* t : {&text, static_cast<const std::string*>(&crlf)}) {
      std::vector<std::string_view> chunks = split_for_encoding(*t, 300, *tok);
      if (t == &text || std::string(name) == "llama3") {
        EXPECT_GT(chunks.size(), 20u) << name;
      }
      std::vector<int32_t> ids;
      for (size_t i = 0; i < chunks.size(); ++i) tok->encode_append(chunks[i], &ids, i == 0);
      EXPECT_EQ(ids, tok->encode(*t)) << name;
    }
  }
}

// A SentencePiece-style vocabulary small enough to reason about: byte fallback, "▁" for
// spaces, merges by rank.
json small_sentencepiece_json(const json& normalizer, const json& pre_tokenizer) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    vocab[hex] = 3 + b;
  }
  int id = 259;
  for (const char* t : {"\xE2\x96\x81", "a", "b", "c", "ab",
                        "\xE2\x96\x81"
                        "ab",
                        "abc", "\xC3\xA9"})
    vocab[t] = id++;
  return {{"added_tokens",
           {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
            {{"id", 1}, {"content", "<s>"}, {"special", true}},
            {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
          {"normalizer", normalizer},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}}}},
          {"model",
           {{"type", "BPE"},
            {"byte_fallback", true},
            {"unk_token", "<unk>"},
            {"vocab", vocab},
            {"merges", {"a b", "\xE2\x96\x81 ab", "ab c"}}}}};
}

TEST(HfTokenizer, SentencePieceStyleNormalizesFallsBackToBytesAndStripsTheLeadingSpace) {
  const json legacy_normalizer = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}};
  const json metaspace = {{"type", "Metaspace"},
                          {"replacement", "\xE2\x96\x81"},
                          {"prepend_scheme", "first"},
                          {"split", false}};
  for (const auto& [normalizer, pre] :
       {std::pair{legacy_normalizer, json()}, std::pair{json(), metaspace}}) {
    ScratchDir dir;
    Tokenizer tok = load_json(dir, small_sentencepiece_json(normalizer, pre));
    EXPECT_EQ(tok.bos(), 1);
    EXPECT_EQ(tok.eos(), 2);
    EXPECT_EQ(tok.document_start(), 1);
    // "ab abc\nxé": ▁ab | ▁ab (then c: "ab c" needs ab first, ▁ab took it) | c | <0x0A> |
    // x by bytes | é.
    const std::vector<int32_t> ids = tok.encode("ab abc\nx\xC3\xA9");
    const std::vector<int32_t> want = {264, 264, 262, 3 + '\n', 3 + 'x', 266};
    EXPECT_EQ(ids, want) << pre.dump();
    EXPECT_EQ(tok.decode(ids), "ab abc\nx\xC3\xA9");
    // A continuation gets no "▁" and keeps its space when decoded.
    std::vector<int32_t> cont;
    tok.encode_append("abc", &cont, /*document_start=*/false);
    EXPECT_EQ(cont, (std::vector<int32_t>{265}));
    // Prepend puts a "▁" before a leading space too; Metaspace does not (Hugging Face's
    // metaspace.rs), so the space is then lost when decoded, as there.
    const bool legacy = pre.is_null();
    EXPECT_EQ(tok.encode(" c"),
              legacy ? (std::vector<int32_t>{259, 259, 262}) : (std::vector<int32_t>{259, 262}));
    EXPECT_EQ(tok.decode(tok.encode(" c")), legacy ? " c" : "c");
    // '\n' is a byte token no merge touches: documents may be cut before it, but not inside
    // a run of line breaks (the run's end may be trimmed).
    EXPECT_TRUE(tok.can_cut_before("ab\nc", 2));
    EXPECT_FALSE(tok.can_cut_before("ab\nc", 1));
    EXPECT_FALSE(tok.can_cut_before("ab\n\nc", 3));
  }
}

// tokenize_to_shards puts a tokenizer.json beside the shards and the manifest names it there,
// so a moved folder still says which tokenizer made it.
TEST(HfTokenizer, TokenizedFoldersCarryTheirTokenizer) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.file("tok"));
  write_bytes(dir.file("tok/tokenizer.json"),
              small_sentencepiece_json(json(), {{"type", "Metaspace"}}).dump());
  auto tok = Tokenizer::load(dir.file("tok"));
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  write_bytes(dir.file("in.jsonl"), "{\"text\": \"ab abc ab\"}\n{\"text\": \"abc c\"}\n");
  TokenizeOptions o;
  o.inputs = {dir.file("in.jsonl")};
  o.out = dir.file("shards");
  o.val_tokens = 2;
  ASSERT_TRUE(tokenize_to_shards(o, *tok).ok());
  EXPECT_EQ(data_tokenizer(dir.file("shards")), dir.file("shards") + "/tokenizer.json");
  std::filesystem::rename(dir.file("shards"), dir.file("moved"));
  std::filesystem::remove_all(dir.file("tok"));
  const std::string moved = data_tokenizer(dir.file("moved"));
  EXPECT_EQ(moved, dir.file("moved") + "/tokenizer.json");
  EXPECT_TRUE(Tokenizer::load(moved).ok());
  EXPECT_EQ(data_tokenizer(kRepo + "/data/gpt2"), "");  // no manifest
}

TEST(HfTokenizer, RefusesWhatItDoesNotImplementByName) {
  auto refused = [](const json& j, const std::string& needle) {
    ScratchDir dir;
    write_bytes(dir.file("tokenizer.json"), j.dump());
    auto r = Tokenizer::load(dir.file("tokenizer.json"));
    ASSERT_FALSE(r.ok()) << j.dump().substr(0, 200);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(dir.file("tokenizer.json")), std::string::npos);
  };
  json wordpiece = {{"model", {{"type", "WordPiece"}, {"vocab", json::object()}}}};
  refused(wordpiece, "WordPiece");
  json qwen = gpt2_tokenizer_json(
      {{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}| ?\\p{L}+"}}}, {"behavior", "Isolated"}});
  refused(qwen, "\\p{N}| ?\\p{L}+");
  json lowercase = small_sentencepiece_json({{"type", "Lowercase"}}, json());
  refused(lowercase, "Lowercase");
  json no_bytes = gpt2_tokenizer_json({{"type", "ByteLevel"}});
  no_bytes["model"]["vocab"].erase("!");
  refused(no_bytes, "byte 33");
  json bad_merge = gpt2_tokenizer_json({{"type", "ByteLevel"}});
  bad_merge["model"]["merges"][5] = "zzzq qqqz";
  refused(bad_merge, "merge 5");
  refused(json::array(), "no \"model\"");
  json typed = gpt2_tokenizer_json({{"type", "ByteLevel"}});  // a string where a flag goes
  typed["model"]["ignore_merges"] = "yes";
  refused(typed, "malformed");
  json id_text = small_sentencepiece_json(json(), {{"type", "Metaspace"}});
  id_text["added_tokens"][0]["id"] = 1.5;
  refused(id_text, "added token");
  ScratchDir dir;
  write_bytes(dir.file("tokenizer.json"), "{\"model\": ");
  auto r = Tokenizer::load(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos);
  // A folder with only SentencePiece's model file is told what to bring.
  ScratchDir spm;
  write_bytes(spm.file("tokenizer.model"), "x");
  r = Tokenizer::load(spm.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().hint().find("tokenizer.json"), std::string::npos) << r.status().hint();
}

}  // namespace
}  // namespace tessera
