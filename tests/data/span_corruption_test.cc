// T5's span-corruption examples: each row's encoder input and targets put back together are
// its text; spans and sentinels are as many as SpanCorruption says; the decoder reads the
// targets after the start token; rows do not depend on how ranks split the batch; a restored
// loader continues identically; bad lengths are refused.
#include "data/span_corruption.h"

#include <gtest/gtest.h>

#include <cstring>

#include "data_test_util.h"

namespace tessera {
namespace {

using testing_util::ScratchDir;

constexpr int kVocab = 1000;

std::string make_shard(const ScratchDir& dir, int n) {
  std::vector<int32_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = (i * 7) % kVocab;
  std::string path = dir.file("t.bin");
  EXPECT_TRUE(write_token_shard(path, tokens, kVocab).ok());
  return path;
}

SpanCorruptionLoader open_ok(const std::string& path, int B, int raw, int rank = 0, int world = 1,
                             uint64_t seed = 5) {
  auto r = SpanCorruptionLoader::open(path, kVocab, B, raw, rank, world, seed);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

std::vector<int32_t> ints(HostBatch& b, const std::string& name) {
  const std::vector<uint8_t>& bytes = b.buffer(name);
  std::vector<int32_t> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

TEST(SpanCorruption, RowsPutBackTogetherAreTheText) {
  const int raw = 50;
  const SpanCorruption sc = span_corruption(raw);
  ASSERT_EQ(sc.noise, 8);  // round(7.5) to even
  ASSERT_EQ(sc.spans, 3);
  std::vector<int32_t> text(raw);
  for (int i = 0; i < raw; ++i) text[i] = 10 + i;
  for (uint64_t key = 0; key < 50; ++key) {
    std::vector<int32_t> enc(sc.encoder_len()), dec(sc.decoder_len()), tgt(sc.decoder_len());
    SpanCorruptionLoader::corrupt(text.data(), sc, key, kVocab, enc.data(), dec.data(), tgt.data());
    // The targets: sentinel 0, its span, sentinel 1, ...; each span non-empty.
    std::vector<std::vector<int32_t>> spans;
    for (int32_t t : tgt) {
      if (t >= kVocab) {
        EXPECT_EQ(t, kVocab + static_cast<int32_t>(spans.size()));
        spans.emplace_back();
      } else {
        ASSERT_FALSE(spans.empty()) << "targets start with a sentinel";
        spans.back().push_back(t);
      }
    }
    ASSERT_EQ(static_cast<int64_t>(spans.size()), sc.spans);
    // The encoder input with each sentinel replaced by its span is the text.
    std::vector<int32_t> back;
    int64_t sentinels = 0;
    for (int32_t t : enc) {
      if (t >= kVocab) {
        const std::vector<int32_t>& s = spans[static_cast<size_t>(t - kVocab)];
        EXPECT_FALSE(s.empty());
        back.insert(back.end(), s.begin(), s.end());
        ++sentinels;
      } else {
        back.push_back(t);
      }
    }
    EXPECT_EQ(sentinels, sc.spans);
    EXPECT_EQ(back, text) << "key " << key;
    EXPECT_NE(enc[0], kVocab) << "kept text comes first";
    EXPECT_EQ(dec[0], kVocab + kT5Sentinels);
    EXPECT_TRUE(std::equal(tgt.begin(), tgt.end() - 1, dec.begin() + 1));
  }
}

TEST(SpanCorruption, RowsDoNotDependOnTheRankSplitAndRestoreContinues) {
  ScratchDir dir;
  const std::string path = make_shard(dir, 4000);
  SpanCorruptionLoader one = open_ok(path, 4, 32);
  SpanCorruptionLoader r0 = open_ok(path, 2, 32, 0, 2), r1 = open_ok(path, 2, 32, 1, 2);
  const SpanCorruption sc = one.corruption();
  const size_t te = static_cast<size_t>(sc.encoder_len());
  LoaderState after2;
  std::vector<std::vector<int32_t>> batches;
  for (int step = 0; step < 4; ++step) {
    if (step == 2) after2 = one.state();
    HostBatch a, b0, b1;
    one.next(&a);
    r0.next(&b0);
    r1.next(&b1);
    std::vector<int32_t> whole = ints(a, kTokensInput), half = ints(b0, kTokensInput),
                         other = ints(b1, kTokensInput);
    half.insert(half.end(), other.begin(), other.end());
    EXPECT_EQ(whole, half) << "step " << step;
    ASSERT_EQ(whole.size(), 4 * te);
    for (const char* name : {kDecoderTokensInput, kTargetsInput}) {
      std::vector<int32_t> w = ints(a, name), h = ints(b0, name), o = ints(b1, name);
      h.insert(h.end(), o.begin(), o.end());
      EXPECT_EQ(w, h) << name << " step " << step;
    }
    batches.push_back(whole);
  }
  EXPECT_NE(batches[0], batches[1]);
  SpanCorruptionLoader again = open_ok(path, 4, 32);
  ASSERT_TRUE(again.restore(after2).ok());
  for (int step = 2; step < 4; ++step) {
    HostBatch a;
    again.next(&a);
    EXPECT_EQ(ints(a, kTokensInput), batches[static_cast<size_t>(step)]) << "step " << step;
  }
  // Another seed draws other spans over the same windows.
  SpanCorruptionLoader other = open_ok(path, 4, 32, 0, 1, 6);
  HostBatch a;
  other.next(&a);
  EXPECT_NE(ints(a, kTokensInput), batches[0]);
}

TEST(SpanCorruption, LengthsWithoutRoomAreRefused) {
  ScratchDir dir;
  const std::string path = make_shard(dir, 40000);
  auto r = SpanCorruptionLoader::open(path, kVocab, 1, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("at least 2"), std::string::npos);
  r = SpanCorruptionLoader::open(path, kVocab, 1, 2100);  // 105 spans
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("sentinels"), std::string::npos) << r.status().to_string();
  EXPECT_TRUE(SpanCorruptionLoader::open(path, kVocab, 1, 2000).ok());
}

}  // namespace
}  // namespace tessera
