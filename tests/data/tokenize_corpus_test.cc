#include "data/tokenize_corpus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "data/pretokenizer.h"
#include "data/token_shards.h"
#include "data_test_util.h"

namespace tessera {
namespace {

using testing_util::kRepo;
using testing_util::read_bytes;
using testing_util::repo_tokenizer;
using testing_util::ScratchDir;
using testing_util::write_bytes;

constexpr int32_t kEot = kGpt2EndOfText;

std::vector<int32_t> shard_tokens(const std::string& path) {
  auto shard = TokenShard::open(path, kGpt2VocabSize);
  EXPECT_TRUE(shard.ok()) << shard.status().to_string();
  if (!shard.ok()) return {};
  std::vector<int32_t> out(shard->size());
  shard->read(0, shard->size(), out.data());
  return out;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(TokenizeCorpus, WritesTrainAndValWithDocumentsSeparatedByEndOfText) {
  const Tokenizer& tok = repo_tokenizer();
  ScratchDir dir;
  std::string doc1 = "First document.\nIt has two lines, and 3 numbers: 1 2 3.";
  std::string doc2 = "Second one \u2014 with \u00e9l\u00e8ve and \u4e16\u754c.\n\nEnd.";
  write_bytes(dir.file("in.txt"), "\n" + doc1 + "\n<|endoftext|>\n" + doc2 + "\n\n<|endoftext|>\n");
  ASSERT_TRUE(tokenize_corpus(dir.file("in.txt"), dir.file("out"), 0.25, tok).ok());

  std::vector<int32_t> want = concat(concat({kEot}, tok.encode(doc1)), {kEot});
  want = concat(want, tok.encode(doc2));
  std::vector<int32_t> train = shard_tokens(dir.file("out/train.bin"));
  std::vector<int32_t> val = shard_tokens(dir.file("out/val.bin"));
  EXPECT_EQ(concat(train, val), want);
  EXPECT_EQ(val.size(), static_cast<size_t>(std::floor(0.25 * want.size())));
  EXPECT_GT(val.size(), 0u);
}

TEST(TokenizeCorpus, ZeroValFractionGivesAnEmptyValShard) {
  ScratchDir dir;
  write_bytes(dir.file("in.txt"), "Just one document.\n");
  ASSERT_TRUE(tokenize_corpus(dir.file("in.txt"), dir.path(), 0.0, repo_tokenizer()).ok());
  EXPECT_EQ(shard_tokens(dir.file("train.bin")).front(), kEot);
  EXPECT_TRUE(shard_tokens(dir.file("val.bin")).empty());
}

TEST(TokenizeCorpus, MissingInputNamesTheFileAndWritesNothing) {
  ScratchDir dir;
  Status s = tokenize_corpus(dir.file("nope.txt"), dir.file("out"), 0.1, repo_tokenizer());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir.file("nope.txt")), std::string::npos);
  EXPECT_FALSE(s.hint().empty());
  EXPECT_FALSE(std::filesystem::exists(dir.file("out")));
}

TEST(TokenizeCorpus, BadValFractionAndEmptyTextAreErrors) {
  ScratchDir dir;
  write_bytes(dir.file("in.txt"), "text");
  EXPECT_FALSE(tokenize_corpus(dir.file("in.txt"), dir.path(), 1.0, repo_tokenizer()).ok());
  EXPECT_FALSE(tokenize_corpus(dir.file("in.txt"), dir.path(), -0.1, repo_tokenizer()).ok());
  write_bytes(dir.file("empty.txt"), "\n\n<|endoftext|>\n");
  Status s = tokenize_corpus(dir.file("empty.txt"), dir.path(), 0.1, repo_tokenizer());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no text"), std::string::npos);
}

// Bytes that are not UTF-8 (a cut gzip file, a lone continuation byte, an overlong form) are
// refused naming where; a byte-order mark is dropped; a split of fewer than 2 tokens (no input
// and target) is refused.
TEST(TokenizeCorpus, NonUtf8InputAndTinySplitsAreRefusedAndABomDropped) {
  ScratchDir dir;
  auto refused = [&](const std::string& bytes, const std::string& text) {
    write_bytes(dir.file("bad.txt"), bytes);
    Status s = tokenize_corpus(dir.file("bad.txt"), dir.file("out"), 0.1, repo_tokenizer());
    EXPECT_FALSE(s.ok()) << text;
    EXPECT_NE(s.to_string().find(text), std::string::npos) << s.to_string();
  };
  refused(std::string("\x1f\x8b\x08\x00\x00\x00", 6), "corrupt .gz");
  refused("caf\xc3\xa9 ok\nthen \x80 here", "byte 0x80 at offset 14 (line 2)");
  refused("overlong \xc0\xaf", "byte 0xC0 at offset 9");
  refused("surrogate \xed\xa0\x80", "byte 0xED");
  refused("a", "each split needs at least 2");  // 2 tokens: EOT and "a", none for validation
  EXPECT_FALSE(std::filesystem::exists(dir.file("out")));

  write_bytes(dir.file("bom.txt"), "\xef\xbb\xbfHello world, hello again.");
  write_bytes(dir.file("plain.txt"), "Hello world, hello again.");
  ASSERT_TRUE(tokenize_corpus(dir.file("bom.txt"), dir.file("a"), 0.0, repo_tokenizer()).ok());
  ASSERT_TRUE(tokenize_corpus(dir.file("plain.txt"), dir.file("b"), 0.0, repo_tokenizer()).ok());
  EXPECT_EQ(shard_tokens(dir.file("a/train.bin")), shard_tokens(dir.file("b/train.bin")));
}

// The documents CorpusReader gives for a text.
std::vector<std::string> documents_of(const std::string& text) {
  ScratchDir dir;
  write_bytes(dir.file("in.txt"), text);
  auto reader = CorpusReader::open({dir.file("in.txt")}, {}, repo_tokenizer());
  EXPECT_TRUE(reader.ok()) << reader.status().to_string();
  std::vector<std::string> docs;
  TextPiece piece;
  while (reader.ok()) {
    auto more = reader->next(&piece);
    EXPECT_TRUE(more.ok()) << more.status().to_string();
    if (!more.ok() || !*more) break;
    EXPECT_TRUE(piece.starts_document);
    docs.push_back(piece.text);
  }
  return docs;
}

TEST(SplitDocuments, TrimsLineBreaksAndDropsEmptyDocuments) {
  EXPECT_EQ(documents_of("\r\nA\n\n<|endoftext|><|endoftext|>\n  B \n<|endoftext|>"),
            (std::vector<std::string>{"A", "  B "}));
  EXPECT_EQ(documents_of("no separator\n"), (std::vector<std::string>{"no separator"}));
  EXPECT_TRUE(documents_of("").empty());
}

// Chunked encoding must give exactly the ids of encoding the whole text.
TEST(SplitForEncoding, ChunkedIdsEqualWholeTextIds) {
  const Tokenizer& tok = repo_tokenizer();
  std::string corpus = read_bytes(kRepo + "/data/corpus/moby_dick.txt");
  // Tricky line ends: spaces before newlines, blank lines, CRLF, non-ASCII before '\n'.
  std::string text = corpus.substr(200000, 40000) +
                     "end  \n\n  next\r\nword\u3000\nx.\n\n\ny \n\tz\n" + corpus.substr(0, 5000);
  std::vector<std::string_view> chunks = split_for_encoding(text, 500, tok);
  EXPECT_GT(chunks.size(), 50u);
  std::string joined;
  std::vector<int32_t> ids;
  for (std::string_view c : chunks) {
    joined += c;
    tok.encode_append(c, &ids);
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(ids, tok.encode(text));
  // Every cut is just before a line break ('\n' or "\r\n") that follows printable ASCII.
  for (size_t i = 1; i < chunks.size(); ++i) {
    EXPECT_TRUE(chunks[i].front() == '\n' || chunks[i].substr(0, 2) == "\r\n") << "chunk " << i;
    char before = chunks[i - 1].back();
    EXPECT_TRUE(before > ' ' && before < 0x7F) << "chunk " << i;
  }
}

// Text with CRLF line ends is cut before the "\r\n" (a '\n' after '\r' is no cut point).
TEST(SplitForEncoding, CrlfTextIsCutBeforeItsLineBreaks) {
  const Tokenizer& tok = repo_tokenizer();
  std::string text;
  for (char c : read_bytes(kRepo + "/data/corpus/moby_dick.txt").substr(50000, 30000))
    text += c == '\n' ? std::string("\r\n") : std::string(1, c);
  std::vector<std::string_view> chunks = split_for_encoding(text, 500, tok);
  EXPECT_GT(chunks.size(), 30u);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (i > 0) {
      EXPECT_EQ(chunks[i].substr(0, 2), "\r\n") << "chunk " << i;
    }
    tok.encode_append(chunks[i], &ids, i == 0);
  }
  EXPECT_EQ(ids, tok.encode(text));
}

TEST(SplitForEncoding, TextWithoutCutPointsStaysWhole) {
  std::string text(3000, 'a');
  EXPECT_EQ(split_for_encoding(text, 100, repo_tokenizer()).size(), 1u);
  std::string spaced = "aaa \nbbb \nccc \n";  // every '\n' follows a space: no safe cut
  EXPECT_EQ(split_for_encoding(spaced, 2, repo_tokenizer()).size(), 1u);
  EXPECT_EQ(split_for_encoding("ab\ncd\nef", 1, repo_tokenizer()).size(), 3u);
}

// The committed corpus is real, valid UTF-8 English text of at least 1 MB.
TEST(Corpus, ShippedTextIsValidUtf8AndLargeEnough) {
  std::string corpus = read_bytes(kRepo + "/data/corpus/moby_dick.txt");
  EXPECT_GE(corpus.size(), 1000000u);
  for (size_t pos = 0; pos < corpus.size();) {
    size_t len = 0;
    ASSERT_GE(decode_utf8(corpus, pos, &len), 0) << "invalid UTF-8 at byte " << pos;
    pos += len;
  }
  EXPECT_NE(corpus.find("Call me Ishmael."), std::string::npos);
}

// tokenize_corpus over an excerpt of the shipped corpus (not all of it: unit tests stay fast).
TEST(TokenizeCorpus, ExcerptOfShippedCorpus) {
  ScratchDir dir;
  std::string corpus = read_bytes(kRepo + "/data/corpus/moby_dick.txt");
  std::string excerpt = corpus.substr(0, 100000);
  write_bytes(dir.file("excerpt.txt"), excerpt);
  ASSERT_TRUE(tokenize_corpus(dir.file("excerpt.txt"), dir.path(), 0.1, repo_tokenizer()).ok());
  std::vector<int32_t> train = shard_tokens(dir.file("train.bin"));
  std::vector<int32_t> val = shard_tokens(dir.file("val.bin"));
  EXPECT_EQ(train.front(), kEot);
  EXPECT_EQ(std::count(train.begin(), train.end(), kEot), 1);
  EXPECT_NEAR(double(val.size()) / double(train.size() + val.size()), 0.1, 0.001);
  // Excerpt ends mid-file, so its trailing line breaks (if any) are trimmed.
  std::string decoded = repo_tokenizer().decode(concat(train, val));
  std::string_view body = excerpt;
  while (!body.empty() && body.back() == '\n') body.remove_suffix(1);
  EXPECT_EQ(decoded, "<|endoftext|>" + std::string(body));
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// The tokens of a tokenized folder, train then val, in order.
std::vector<int32_t> folder_tokens(const std::string& dir, int vocab = kGpt2VocabSize) {
  auto files = find_token_shards(dir);
  EXPECT_TRUE(files.ok()) << files.status().to_string();
  std::vector<int32_t> all;
  if (!files.ok()) return all;
  for (const auto* split : {&files->train, &files->val})
    for (const std::string& f : *split) {
      auto shard = TokenShard::open(f, vocab);
      EXPECT_TRUE(shard.ok()) << shard.status().to_string();
      std::vector<int32_t> ids(shard->size());
      shard->read(0, shard->size(), ids.data());
      all.insert(all.end(), ids.begin(), ids.end());
    }
  return all;
}

// Documents of moby_dick.txt, written as JSONL and as one text file with separators.
void write_corpus(const ScratchDir& dir, int docs) {
  const std::string book = read_bytes(kRepo + "/data/corpus/moby_dick.txt");
  std::string jsonl, text;
  for (int i = 0; i < docs; ++i) {
    size_t from = static_cast<size_t>(i) * 7919 % 900000, to = from + 500 + i * 37 % 3000;
    auto continuation = [&](size_t at) {
      return (static_cast<unsigned char>(book[at]) & 0xC0) == 0x80;
    };
    while (continuation(from)) ++from;  // whole UTF-8 characters
    while (continuation(to)) ++to;
    std::string doc = book.substr(from, to - from);
    while (!doc.empty() && (doc.back() == '\n' || doc.back() == '\r')) doc.pop_back();
    while (!doc.empty() && (doc.front() == '\n' || doc.front() == '\r')) doc.erase(0, 1);
    jsonl += nlohmann::json{{"text", doc}}.dump() + "\n";
    text += doc + "<|endoftext|>";
  }
  write_bytes(dir.file("docs.jsonl"), jsonl);
  write_bytes(dir.file("docs.txt"), text);
}

TEST(TokenizeToShards, ManyShardsHoldTheTokensOfOneAndTheLastAreValidation) {
  ScratchDir dir;
  write_corpus(dir, 200);
  TokenizeOptions one;
  one.inputs = {dir.file("docs.txt")};
  one.out = dir.file("one");
  one.shard_tokens = int64_t{1} << 40;
  one.val_tokens = 3000;
  auto a = tokenize_to_shards(one, repo_tokenizer());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->train_shards.size(), 1u);
  EXPECT_EQ(a->documents, 200);
  TokenizeOptions many = one;
  many.inputs = {dir.file("docs.jsonl")};
  many.out = dir.file("many");
  many.shard_tokens = 7000;
  many.threads = 3;
  auto b = tokenize_to_shards(many, repo_tokenizer());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_GT(b->train_shards.size(), 5u);
  EXPECT_EQ(b->val_shards.size(), 1u);  // 3000 of a 7000-token shard: one split shard
  EXPECT_EQ(b->val_tokens, 3000);
  const std::vector<int32_t> tokens = folder_tokens(dir.file("one"));
  EXPECT_EQ(folder_tokens(dir.file("many")), tokens);
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), kEot), 200);
  EXPECT_EQ(tokens.front(), kEot);
  // The manifest lists every shard; a truncated one is named.
  auto manifest = nlohmann::json::parse(read_bytes(dir.file("many/manifest.json")));
  EXPECT_EQ(manifest["tokens"], static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(manifest["train"].size(), b->train_shards.size());
  std::filesystem::resize_file(b->train_shards[2], 100);
  auto files = find_token_shards(dir.file("many"));
  ASSERT_FALSE(files.ok());
  EXPECT_NE(files.status().message().find("train_000002.bin has 100 bytes, manifest.json says"),
            std::string::npos)
      << files.status().message();
}

TEST(TokenizeToShards, AFailureLeavesTheEarlierShardsAndNoStaging) {
  ScratchDir dir;
  write_corpus(dir, 20);
  TokenizeOptions o;
  o.inputs = {dir.file("docs.jsonl")};
  o.out = dir.file("out");
  o.shard_tokens = 2000;
  ASSERT_TRUE(tokenize_to_shards(o, repo_tokenizer()).ok());
  const std::vector<std::string> before = [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir.file("out")))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }();
  write_bytes(dir.file("bad.jsonl"), "{\"text\": \"fine\"}\n{\"nope\": 1}\n");
  o.inputs = {dir.file("docs.jsonl"), dir.file("bad.jsonl")};
  auto r = tokenize_to_shards(o, repo_tokenizer());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bad.jsonl' line 2"), std::string::npos);
  std::vector<std::string> after;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("out")))
    after.push_back(e.path().filename().string());
  std::sort(after.begin(), after.end());
  EXPECT_EQ(after, before);  // no staging folder, nothing replaced
  // A second run with fewer shards replaces all of the first's.
  o.inputs = {dir.file("docs.jsonl")};
  o.shard_tokens = int64_t{1} << 40;
  ASSERT_TRUE(tokenize_to_shards(o, repo_tokenizer()).ok());
  EXPECT_FALSE(std::filesystem::exists(dir.file("out/train_000001.bin")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("out/train.bin")));
  // A killed run's staging folder (its process gone) is removed by the next run.
  const std::string stale = dir.file("out/.tokenize-staging-4194999");  // above pid_max
  std::filesystem::create_directories(stale);
  write_bytes(stale + "/part_000000.bin", "x");
  ASSERT_TRUE(tokenize_to_shards(o, repo_tokenizer()).ok());
  EXPECT_FALSE(std::filesystem::exists(stale));
  // A failure into a new folder leaves no folder.
  o.inputs = {dir.file("bad.jsonl")};
  o.out = dir.file("fresh");
  EXPECT_FALSE(tokenize_to_shards(o, repo_tokenizer()).ok());
  EXPECT_FALSE(std::filesystem::exists(dir.file("fresh")));
}

}  // namespace
}  // namespace tessera
