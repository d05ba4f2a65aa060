#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "data/pretokenizer.h"
#include "data_test_util.h"

namespace tessera {
namespace {

using testing_util::kRepo;
using testing_util::read_bytes;
using testing_util::repo_tokenizer;
using testing_util::ScratchDir;
using testing_util::write_bytes;

std::vector<std::string> pieces_of(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view p : gpt2_pretokenize(text)) out.emplace_back(p);
  return out;
}

// --- Golden: ids from the gpt-3-encoder JS package (tools/make_tokenizer_golden.js) ---

TEST(Tokenizer, MatchesJsEncoderGoldenIds) {
  nlohmann::json golden =
      nlohmann::json::parse(read_bytes(kRepo + "/tests/data/golden/tokenizer_golden.json"));
  const Tokenizer& tok = repo_tokenizer();
  ASSERT_GE(golden["cases"].size(), 40u);
  size_t total_ids = 0;
  for (const auto& c : golden["cases"]) {
    std::string name = c["name"];
    std::string text = c["text"];
    std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), want) << "golden case " << name;
    EXPECT_EQ(tok.decode(want), text) << "golden case " << name;
    total_ids += want.size();
  }
  EXPECT_GT(total_ids, 2000u);
}

TEST(Tokenizer, KnownIdsAndEndOfText) {
  const Tokenizer& tok = repo_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.encode("Hello, world!"), (std::vector<int32_t>{15496, 11, 995, 0}));
  EXPECT_EQ(tok.token_bytes(995), " world");
  EXPECT_EQ(tok.token_bytes(198), "\n");
  // The literal text is ordinary text, never the special id; the id decodes to the text.
  std::vector<int32_t> ids = tok.encode("<|endoftext|>");
  EXPECT_GT(ids.size(), 1u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), kGpt2EndOfText), 0);
  std::vector<int32_t> eot = {kGpt2EndOfText};
  EXPECT_EQ(tok.decode(eot), "<|endoftext|>");
}

TEST(Tokenizer, RoundTripsArbitraryBytesIncludingInvalidUtf8) {
  const Tokenizer& tok = repo_tokenizer();
  std::mt19937 rng(7);
  const std::string alphabet = std::string("ab Z9'\n\t\r.,") + "\xC3\xA9" + "\xE4\xB8\x96" +
                               "\xF0\x9F\x98\x80" + "\x80\xFF\xC0\xED\xA0" + '\0';
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<int32_t> ids = tok.encode(text);
    EXPECT_EQ(tok.decode(ids), text) << "trial " << trial;
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < kGpt2EndOfText);
  }
}

TEST(Tokenizer, CacheGivesSameIdsOnRepeat) {
  const Tokenizer& tok = repo_tokenizer();
  std::string text = "repetition repetition, repetition! Repetition repetition";
  std::vector<int32_t> first = tok.encode(text);
  EXPECT_EQ(tok.encode(text), first);
  // " repetition" appears three times and must encode identically each time.
  std::vector<int32_t> one = tok.encode(" repetition");
  EXPECT_NE(std::search(first.begin(), first.end(), one.begin(), one.end()), first.end());
}

// Not a timed assertion: reports the rate on a 300 KB excerpt of the corpus.
TEST(Tokenizer, ReportsThroughputOnCorpusExcerpt) {
  std::string corpus = read_bytes(kRepo + "/data/corpus/moby_dick.txt");
  ASSERT_GT(corpus.size(), 400000u);
  std::string excerpt = corpus.substr(100000, 300000);
  auto fresh = Tokenizer::load(kRepo + "/data/gpt2");  // an empty piece cache
  ASSERT_TRUE(fresh.ok());
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> ids = fresh->encode(excerpt);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(fresh->decode(ids), excerpt);
  EXPECT_GT(ids.size(), excerpt.size() / 6);  // English: ~4 bytes per token
  EXPECT_LT(ids.size(), excerpt.size() / 2);
  RecordProperty("encode_MB_per_s", std::to_string(excerpt.size() / s / 1e6));
  std::printf("encode: %.2f MB/s (%zu bytes -> %zu tokens, cold cache)\n", excerpt.size() / s / 1e6,
              excerpt.size(), ids.size());
}

// --- Pre-tokenization ---

TEST(Gpt2Pretokenizer, SplitsLikeTheGpt2Regex) {
  // Expected pieces from the JS regex of gpt-3-encoder.
  EXPECT_EQ(pieces_of("Hello  world's\n"),
            (std::vector<std::string>{"Hello", " ", " world", "'s", "\n"}));
  EXPECT_EQ(pieces_of("DON'T we're"), (std::vector<std::string>{"DON", "'", "T", " we", "'re"}));
  EXPECT_EQ(pieces_of("a \n b"), (std::vector<std::string>{"a", " \n", " b"}));
  EXPECT_EQ(pieces_of("x\t\t y  \n"), (std::vector<std::string>{"x", "\t\t", " y", "  \n"}));
  EXPECT_EQ(pieces_of(" 123abc!? "), (std::vector<std::string>{" 123", "abc", "!?", " "}));
  EXPECT_EQ(pieces_of("   "), (std::vector<std::string>{"   "}));
  EXPECT_EQ(pieces_of("caf\u00e9\u3000\u4e16\u754c \U0001F600!"),
            (std::vector<std::string>{"caf\u00e9", "\u3000", "\u4e16\u754c", " \U0001F600!"}));
  EXPECT_EQ(pieces_of("\u00bd\u2166x2"), (std::vector<std::string>{"\u00bd\u2166", "x", "2"}));
  EXPECT_TRUE(pieces_of("").empty());
}

TEST(Gpt2Pretokenizer, UsesJsWhitespaceForNelAndBom) {
  // JS's \s excludes U+0085 and includes U+FEFF (Python's regex module: the reverse).
  EXPECT_EQ(pieces_of("a\u0085b\ufeffc"),
            (std::vector<std::string>{"a", "\u0085", "b", "\ufeff", "c"}));
  EXPECT_EQ(char_class(0x85), CharClass::other);
  EXPECT_EQ(char_class(0xFEFF), CharClass::space);
}

TEST(Gpt2Pretokenizer, CharClassesOverAllPlanes) {
  EXPECT_EQ(char_class('A'), CharClass::letter);
  EXPECT_EQ(char_class('z'), CharClass::letter);
  EXPECT_EQ(char_class('7'), CharClass::number);
  EXPECT_EQ(char_class(' '), CharClass::space);
  EXPECT_EQ(char_class('\v'), CharClass::space);
  EXPECT_EQ(char_class('_'), CharClass::other);
  EXPECT_EQ(char_class(0x3000), CharClass::space);    // ideographic space
  EXPECT_EQ(char_class(0x4E16), CharClass::letter);   // CJK
  EXPECT_EQ(char_class(0x0301), CharClass::other);    // combining acute (Mn)
  EXPECT_EQ(char_class(0x0661), CharClass::number);   // Arabic-Indic one
  EXPECT_EQ(char_class(0x1D400), CharClass::letter);  // mathematical bold A
  EXPECT_EQ(char_class(0x20000), CharClass::letter);  // CJK extension B
  EXPECT_EQ(char_class(0x1F600), CharClass::other);   // emoji
  EXPECT_EQ(char_class(0x10FFFF), CharClass::other);
}

TEST(Gpt2Pretokenizer, DecodesUtf8StrictlyAndKeepsInvalidBytes) {
  size_t len = 0;
  EXPECT_EQ(decode_utf8("\xF0\x9F\x98\x80", 0, &len), 0x1F600);
  EXPECT_EQ(len, 4u);
  EXPECT_EQ(decode_utf8("\xC0\x80", 0, &len), -1);          // overlong NUL
  EXPECT_EQ(decode_utf8("\xE0\x80\x80", 0, &len), -1);      // overlong
  EXPECT_EQ(decode_utf8("\xED\xA0\x80", 0, &len), -1);      // surrogate
  EXPECT_EQ(decode_utf8("\xF4\x90\x80\x80", 0, &len), -1);  // > U+10FFFF
  EXPECT_EQ(decode_utf8("\xE4\xB8", 0, &len), -1);          // cut short
  EXPECT_EQ(len, 1u);
  // Invalid bytes are one-byte "other" pieces, joined with neighbouring punctuation.
  EXPECT_EQ(pieces_of("a\x80\xFF!b"), (std::vector<std::string>{"a", "\x80\xFF!", "b"}));
}

TEST(Gpt2Pretokenizer, PiecesAlwaysConcatenateToInput) {
  std::mt19937 rng(11);
  const std::string alphabet = "aZ 1\n\t'.\xC3\xA9\xE3\x80\x80\x80";
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    int len = static_cast<int>(rng() % 30);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::string joined;
    for (std::string_view p : gpt2_pretokenize(text)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    EXPECT_EQ(joined, text);
  }
}

// --- load() errors ---

TEST(TokenizerLoad, MissingDirectoryNamesIt) {
  auto r = Tokenizer::load("/nonexistent/gpt2_dir");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/gpt2_dir"), std::string::npos);
  EXPECT_NE(r.status().hint().find("data/gpt2"), std::string::npos);
}

TEST(TokenizerLoad, MissingFileNamesTheFile) {
  ScratchDir dir;
  std::filesystem::copy_file(kRepo + "/data/gpt2/encoder.json", dir.file("encoder.json"));
  auto r = Tokenizer::load(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("vocab.bpe"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(dir.path()), std::string::npos);
}

TEST(TokenizerLoad, CorruptEncoderJsonIsReported) {
  ScratchDir dir;
  std::filesystem::copy_file(kRepo + "/data/gpt2/vocab.bpe", dir.file("vocab.bpe"));
  write_bytes(dir.file("encoder.json"), "{\"a\": 1, ");
  auto r = Tokenizer::load(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("encoder.json"), std::string::npos);
  EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos);

  write_bytes(dir.file("encoder.json"), "{\"a\": 0, \"b\": 1}");
  r = Tokenizer::load(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("50257"), std::string::npos) << r.status().message();
}

TEST(TokenizerLoad, TruncatedMergesAreReported) {
  ScratchDir dir;
  std::filesystem::copy_file(kRepo + "/data/gpt2/encoder.json", dir.file("encoder.json"));
  std::string merges = read_bytes(kRepo + "/data/gpt2/vocab.bpe");
  write_bytes(dir.file("vocab.bpe"), merges.substr(0, merges.size() / 2));
  auto r = Tokenizer::load(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("vocab.bpe"), std::string::npos);
  // Either the cut line or the short merge count is named.
  EXPECT_TRUE(r.status().message().find("merges") != std::string::npos ||
              r.status().message().find("line") != std::string::npos)
      << r.status().message();

  write_bytes(dir.file("vocab.bpe"), "#version: 0.2\nq x y\n");
  r = Tokenizer::load(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("line 2"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace tessera
