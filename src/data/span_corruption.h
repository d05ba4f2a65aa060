// T5's span-corruption examples (Raffel et al. 2020) from a token shard, for training an
// encoder-decoder on plain text:
//
//   TS_ASSIGN_OR_RETURN(SpanCorruptionLoader loader,
//                       SpanCorruptionLoader::open("train.bin", /*text_vocab=*/50257, /*B=*/8,
//                                              /*raw=*/128, rank, world, /*seed=*/1234));
//   loader.next(&batch);  // "tokens" [B, Te], "decoder_tokens" [B, Td], "targets" [B, Td]
//
// Rows are the windows of `raw` tokens a DataLoader with T = raw reads (the same order, split
// and resumable state). Each is corrupted as models/model.h's SpanCorruption says: its noise
// tokens fall into `spans` spans at random (kept text first, then spans and kept text
// alternating); the encoder reads the kept text with sentinel text_vocab + i for the i-th span,
// the decoder reads the targets shifted right after the start token text_vocab + kT5Sentinels
// and predicts each sentinel then its span. Where the spans fall depends only on (seed,
// epoch, global batch, global row), so N ranks see the examples of one rank and a resumed run
// the examples of an uninterrupted one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "data/batch_stream.h"
#include "data/loader.h"
#include "models/model.h"

namespace tessera {

class SpanCorruptionLoader : public BatchStream {
 public:
  // As DataLoader::open with T = raw; fails also when raw < 2 or the corruption would need
  // more than kT5Sentinels sentinels.
  static Result<SpanCorruptionLoader> open(const std::string& path, int text_vocab, int B, int raw,
                                           int rank = 0, int world = 1, uint64_t seed = 0);

  void next(HostBatch* batch) override;
  LoaderState state() const override { return text_.state(); }
  Status restore(const LoaderState& state) override { return text_.restore(state); }

  const SpanCorruption& corruption() const { return sc_; }

  // Corrupts one row of sc.raw tokens of `text` with the spans that `key` draws: writes
  // sc.encoder_len() tokens to `encoder` and sc.decoder_len() to `decoder_in` and `targets`.
  static void corrupt(const int32_t* text, const SpanCorruption& sc, uint64_t key,
                      int32_t text_vocab, int32_t* encoder, int32_t* decoder_in, int32_t* targets);

 private:
  SpanCorruptionLoader(DataLoader text, SpanCorruption sc, int text_vocab, int B, int rank,
                       uint64_t seed)
      : text_(std::move(text)), sc_(sc), text_vocab_(text_vocab), B_(B), rank_(rank), seed_(seed) {}

  DataLoader text_;
  SpanCorruption sc_;
  int text_vocab_, B_, rank_;
  uint64_t seed_;
  std::vector<int32_t> raw_, unused_, enc_, dec_, tgt_;
};

}  // namespace tessera
