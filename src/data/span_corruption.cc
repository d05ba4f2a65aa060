#include "data/span_corruption.h"

#include <algorithm>
#include <numeric>

#include "base/check.h"

namespace tessera {
namespace {

// `items` split into `parts` >= 1 runs of at least one, uniformly over the ways to cut it:
// parts - 1 distinct cut points among the items - 1 gaps.
std::vector<int64_t> random_runs(int64_t items, int64_t parts, SplitMix64& rng) {
  std::vector<int64_t> gaps(static_cast<size_t>(items - 1));
  std::iota(gaps.begin(), gaps.end(), int64_t{1});
  for (int64_t i = 0; i < parts - 1; ++i)  // partial Fisher-Yates: the first parts - 1 gaps
    std::swap(gaps[static_cast<size_t>(i)],
              gaps[static_cast<size_t>(i) + rng.below(static_cast<uint64_t>(items - 1 - i))]);
  std::vector<int64_t> cuts(gaps.begin(), gaps.begin() + (parts - 1));
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(items);
  std::vector<int64_t> runs;
  int64_t prev = 0;
  for (int64_t c : cuts) {
    runs.push_back(c - prev);
    prev = c;
  }
  return runs;
}

uint64_t mix(uint64_t x) { return SplitMix64(x).next(); }

}  // namespace

Result<SpanCorruptionLoader> SpanCorruptionLoader::open(const std::string& path, int text_vocab,
                                                        int B, int raw, int rank, int world,
                                                        uint64_t seed) {
  if (raw < 2)
    return error(
        "span corruption needs at least 2 tokens of text per example, got " + std::to_string(raw),
        "use --seq 2 or more (T5 trains on 512)");
  const SpanCorruption sc = span_corruption(raw);
  if (sc.spans > kT5Sentinels)
    return error("--seq " + std::to_string(raw) + " corrupts " + std::to_string(sc.spans) +
                     " spans per example, more than T5's " + std::to_string(kT5Sentinels) +
                     " sentinels",
                 "use --seq 2009 or less");
  TS_ASSIGN_OR_RETURN(DataLoader text,
                      DataLoader::open(path, text_vocab, B, raw, rank, world, seed));
  return SpanCorruptionLoader(std::move(text), sc, text_vocab, B, rank, seed);
}

void SpanCorruptionLoader::corrupt(const int32_t* text, const SpanCorruption& sc, uint64_t key,
                                   int32_t text_vocab, int32_t* encoder, int32_t* decoder_in,
                                   int32_t* targets) {
  SplitMix64 rng(key);
  const std::vector<int64_t> noise = random_runs(sc.noise, sc.spans, rng);
  const std::vector<int64_t> kept = random_runs(sc.raw - sc.noise, sc.spans, rng);
  int64_t at = 0, e = 0, d = 0;
  for (int64_t s = 0; s < sc.spans; ++s) {
    const size_t i = static_cast<size_t>(s);
    const int32_t sentinel = text_vocab + static_cast<int32_t>(s);
    for (int64_t k = 0; k < kept[i]; ++k) encoder[e++] = text[at++];
    encoder[e++] = sentinel;
    targets[d++] = sentinel;
    for (int64_t k = 0; k < noise[i]; ++k) targets[d++] = text[at++];
  }
  TS_CHECK(at == sc.raw && e == sc.encoder_len() && d == sc.decoder_len());
  decoder_in[0] = text_vocab + static_cast<int32_t>(kT5Sentinels);
  std::copy(targets, targets + d - 1, decoder_in + 1);
}

void SpanCorruptionLoader::next(HostBatch* batch) {
  const LoaderState at = text_.state();  // which global batch this is
  text_.next(&raw_, &unused_);
  const size_t te = static_cast<size_t>(sc_.encoder_len()),
               td = static_cast<size_t>(sc_.decoder_len());
  enc_.resize(B_ * te);
  dec_.resize(B_ * td);
  tgt_.resize(B_ * td);
  for (int b = 0; b < B_; ++b) {
    const uint64_t row = static_cast<uint64_t>(rank_) * static_cast<uint64_t>(B_) + b;
    // One stream per (seed, epoch, batch, row), each folded in through SplitMix64's mixer.
    const uint64_t key = mix(mix(mix(mix(seed_) ^ at.epoch) ^ at.position) ^ row);
    const size_t b_ = static_cast<size_t>(b);
    corrupt(raw_.data() + b_ * static_cast<size_t>(sc_.raw), sc_, key, text_vocab_,
            enc_.data() + b_ * te, dec_.data() + b_ * td, tgt_.data() + b_ * td);
  }
  batch->append(kTokensInput, enc_.data(), enc_.size());
  batch->append(kDecoderTokensInput, dec_.data(), dec_.size());
  batch->append(kTargetsInput, tgt_.data(), tgt_.size());
}

}  // namespace tessera
