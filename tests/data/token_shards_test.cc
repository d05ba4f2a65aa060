#include "data/token_shards.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <numeric>

#include "data_test_util.h"

namespace tessera {
namespace {

using testing_util::read_bytes;
using testing_util::ScratchDir;
using testing_util::write_bytes;

constexpr int kVocab = 50257;

std::vector<int32_t> sample_tokens(int n, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919LL + 13) % vocab);
  return t;
}

std::vector<int32_t> all_tokens(const TokenShard& shard) {
  std::vector<int32_t> out(shard.size());
  shard.read(0, shard.size(), out.data());
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Writes a valid shard and returns its bytes for tests that then damage it.
std::string valid_shard_bytes(const ScratchDir& dir, int n) {
  std::string path = dir.file("ok.bin");
  EXPECT_TRUE(write_token_shard(path, sample_tokens(n, kVocab), kVocab).ok());
  return read_bytes(path);
}

TEST(TokenShard, RoundTripsUint16) {
  ScratchDir dir;
  std::vector<int32_t> tokens = sample_tokens(10000, kVocab);
  tokens[3] = kVocab - 1;
  tokens[4] = 0;
  std::string path = dir.file("train.bin");
  ASSERT_TRUE(write_token_shard(path, tokens, kVocab).ok());
  EXPECT_EQ(std::filesystem::file_size(path), kTokenShardHeaderBytes + 2 * tokens.size());
  EXPECT_EQ(read_bytes(path).substr(0, 5), "TSTOK");

  auto shard = TokenShard::open(path, kVocab);
  ASSERT_TRUE(shard.ok()) << shard.status().to_string();
  EXPECT_EQ(shard->size(), 10000);
  EXPECT_EQ(shard->bytes_per_token(), 2);
  EXPECT_EQ(all_tokens(*shard), tokens);
  EXPECT_EQ((*shard)[3], kVocab - 1);
  std::vector<int32_t> mid(5);
  shard->read(100, 5, mid.data());
  EXPECT_EQ(mid, std::vector<int32_t>(tokens.begin() + 100, tokens.begin() + 105));
  // Only the shard is left: the temporary file was renamed.
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"train.bin"});
}

TEST(TokenShard, UsesUint32WhenTheVocabDoesNotFit) {
  ScratchDir dir;
  const int vocab = 100000;
  std::vector<int32_t> tokens = {0, 65535, 65536, 99999, 12345};
  std::string path = dir.file("big.bin");
  ASSERT_TRUE(write_token_shard(path, tokens, vocab).ok());
  EXPECT_EQ(std::filesystem::file_size(path), kTokenShardHeaderBytes + 4 * tokens.size());
  auto shard = TokenShard::open(path, vocab);
  ASSERT_TRUE(shard.ok()) << shard.status().to_string();
  EXPECT_EQ(shard->bytes_per_token(), 4);
  EXPECT_EQ(all_tokens(*shard), tokens);
}

TEST(TokenShard, EmptyShardOpens) {
  ScratchDir dir;
  std::string path = dir.file("empty.bin");
  ASSERT_TRUE(write_token_shard(path, {}, kVocab).ok());
  auto shard = TokenShard::open(path, kVocab);
  ASSERT_TRUE(shard.ok()) << shard.status().to_string();
  EXPECT_EQ(shard->size(), 0);
}

TEST(TokenShard, OverwriteReplacesTheWholeFile) {
  ScratchDir dir;
  std::string path = dir.file("x.bin");
  ASSERT_TRUE(write_token_shard(path, sample_tokens(1000, kVocab), kVocab).ok());
  ASSERT_TRUE(write_token_shard(path, std::vector<int32_t>{5, 6, 7}, kVocab).ok());
  auto shard = TokenShard::open(path, kVocab);
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(all_tokens(*shard), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"x.bin"});
}

TEST(TokenShard, MissingPathNamesItAndSuggestsTokenize) {
  auto shard = TokenShard::open("/nonexistent/dir/train.bin", kVocab);
  ASSERT_FALSE(shard.ok());
  EXPECT_TRUE(contains(shard.status().message(), "/nonexistent/dir/train.bin"));
  EXPECT_TRUE(contains(shard.status().message(), "does not exist"));
  EXPECT_TRUE(contains(shard.status().hint(), "tessera tokenize"));
}

// llm.c's shards as its dev/data/data_common.py writes them: 256 int32 (magic 20240520,
// version 1 for uint16 tokens or 2 for uint32, the token count), then the tokens.
std::string llmc_bytes(const std::vector<int32_t>& tokens, int version) {
  int32_t header[256] = {};
  header[0] = 20240520;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  std::string out(reinterpret_cast<const char*>(header), sizeof(header));
  for (int32_t t : tokens) {
    if (version == 1) {
      const uint16_t v = static_cast<uint16_t>(t);
      out.append(reinterpret_cast<const char*>(&v), sizeof(v));
    } else {
      out.append(reinterpret_cast<const char*>(&t), sizeof(t));
    }
  }
  return out;
}

TEST(TokenShard, ReadsLlmcShardsAsTheyAre) {
  ScratchDir dir;
  const std::vector<int32_t> tokens = sample_tokens(300, kVocab);
  for (int version : {1, 2}) {
    SCOPED_TRACE(version);
    const std::string path = dir.file("fineweb_train_00000" + std::to_string(version) + ".bin");
    write_bytes(path, llmc_bytes(tokens, version));
    auto shard = TokenShard::open(path, kVocab);
    ASSERT_TRUE(shard.ok()) << shard.status().to_string();
    EXPECT_EQ(shard->size(), 300);
    EXPECT_EQ(shard->bytes_per_token(), version == 1 ? 2 : 4);
    std::vector<int32_t> got(300);
    shard->read(0, 300, got.data());
    EXPECT_EQ(got, tokens);
  }
  // A version llm.c never wrote, a file shorter than its count, an id beyond the vocabulary.
  write_bytes(dir.file("v3.bin"), llmc_bytes(tokens, 3));
  EXPECT_TRUE(contains(TokenShard::open(dir.file("v3.bin"), kVocab).status().message(),
                       "llm.c shard of version 3"));
  std::string cut = llmc_bytes(tokens, 1);
  cut.resize(cut.size() - 2);
  write_bytes(dir.file("cut.bin"), cut);
  EXPECT_TRUE(
      contains(TokenShard::open(dir.file("cut.bin"), kVocab).status().message(), "truncated"));
  write_bytes(dir.file("big.bin"), llmc_bytes({1, 2, 60000}, 1));
  EXPECT_TRUE(contains(TokenShard::open(dir.file("big.bin"), kVocab).status().message(),
                       "token id 60000 at index 2 (byte offset 1028)"));
}

TEST(TokenShard, BadMagicIsRejected) {
  ScratchDir dir;
  std::string bytes = valid_shard_bytes(dir, 100);
  bytes[0] = 'X';
  write_bytes(dir.file("bad.bin"), bytes);
  auto shard = TokenShard::open(dir.file("bad.bin"), kVocab);
  ASSERT_FALSE(shard.ok());
  EXPECT_TRUE(contains(shard.status().message(), dir.file("bad.bin")));
  EXPECT_TRUE(contains(shard.status().message(), "magic"));
  EXPECT_TRUE(contains(shard.status().hint(), "tessera tokenize"));
}

TEST(TokenShard, UnknownVersionAndWidthAreRejected) {
  ScratchDir dir;
  std::string bytes = valid_shard_bytes(dir, 100);
  std::string v2 = bytes;
  v2[8] = 2;  // version
  write_bytes(dir.file("v2.bin"), v2);
  auto shard = TokenShard::open(dir.file("v2.bin"), kVocab);
  ASSERT_FALSE(shard.ok());
  EXPECT_TRUE(contains(shard.status().message(), "version 2"));

  std::string w3 = bytes;
  w3[12] = 3;  // bytes per token
  write_bytes(dir.file("w3.bin"), w3);
  shard = TokenShard::open(dir.file("w3.bin"), kVocab);
  ASSERT_FALSE(shard.ok());
  EXPECT_TRUE(contains(shard.status().message(), "3 bytes per token"));
}

TEST(TokenShard, TruncatedOrPaddedFileIsRejected) {
  ScratchDir dir;
  std::string bytes = valid_shard_bytes(dir, 100);
  write_bytes(dir.file("cut.bin"), bytes.substr(0, bytes.size() - 1));
  auto shard = TokenShard::open(dir.file("cut.bin"), kVocab);
  ASSERT_FALSE(shard.ok());
  EXPECT_TRUE(contains(shard.status().message(), "100 tokens"));
  EXPECT_TRUE(contains(shard.status().message(), std::to_string(bytes.size() - 1) + " bytes"));

  write_bytes(dir.file("long.bin"), bytes + "xx");
  EXPECT_FALSE(TokenShard::open(dir.file("long.bin"), kVocab).ok());

  write_bytes(dir.file("tiny.bin"), bytes.substr(0, 10));
  shard = TokenShard::open(dir.file("tiny.bin"), kVocab);
  ASSERT_FALSE(shard.ok());
  EXPECT_TRUE(contains(shard.status().message(), "shorter than its 32-byte header"));
}

TEST(TokenShard, IdAtOrAboveVocabNamesIndexAndOffset) {
  ScratchDir dir;
  std::string bytes = valid_shard_bytes(dir, 100);
  uint16_t bad = kVocab;  // first id outside the vocab
  std::memcpy(&bytes[kTokenShardHeaderBytes + 2 * 57], &bad, 2);
  write_bytes(dir.file("badid.bin"), bytes);
  auto shard = TokenShard::open(dir.file("badid.bin"), kVocab);
  ASSERT_FALSE(shard.ok());
  const std::string& m = shard.status().message();
  EXPECT_TRUE(contains(m, "token id 50257 at index 57")) << m;
  EXPECT_TRUE(contains(m, "byte offset " + std::to_string(kTokenShardHeaderBytes + 114))) << m;
  EXPECT_TRUE(contains(shard.status().hint(), "tessera tokenize"));
}

TEST(TokenShard, ReadingWithASmallerVocabIsRejected) {
  ScratchDir dir;
  valid_shard_bytes(dir, 100);
  auto shard = TokenShard::open(dir.file("ok.bin"), 1000);
  ASSERT_FALSE(shard.ok());
  EXPECT_TRUE(contains(shard.status().message(), "vocab of 50257"));
}

TEST(TokenShardWriter, OutOfVocabTokenFailsAndLeavesNoFile) {
  ScratchDir dir;
  std::vector<int32_t> tokens = {1, 2, kVocab, 3};
  Status s = write_token_shard(dir.file("x.bin"), tokens, kVocab);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.message(), "index 2"));
  EXPECT_TRUE(dir.entries().empty());
  tokens[2] = -1;
  EXPECT_FALSE(write_token_shard(dir.file("x.bin"), tokens, kVocab).ok());
}

TEST(TokenShardWriter, MissingDirectoryFails) {
  Status s = write_token_shard("/nonexistent/dir/x.bin", std::vector<int32_t>{1, 2}, kVocab);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.message(), "/nonexistent/dir/x.bin"));
  EXPECT_TRUE(contains(s.hint(), "/nonexistent/dir"));
}

TEST(TokenShardWriter, FailedRenameLeavesNoTemporaryBehind) {
  ScratchDir dir;
  // The target is a non-empty directory: everything succeeds up to the rename.
  std::filesystem::create_directory(dir.file("taken"));
  write_bytes(dir.file("taken/keep"), "x");
  Status s = write_token_shard(dir.file("taken"), sample_tokens(1000, kVocab), kVocab);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.message(), "rename"));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"taken"});
}

}  // namespace
}  // namespace tessera
