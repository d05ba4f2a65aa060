#include "train/train_options.h"

#include <cmath>
#include <cstdio>
#include <utility>

#include "data/tokenizer.h"
#include "parallel/plan.h"

namespace tessera {

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Status check_train_options(const TrainOptions& o, const ModelConfig& cfg) {
  auto positive = [](const char* flag, int64_t v) -> Status {
    if (v <= 0) return error(std::string(flag) + " must be positive, got " + std::to_string(v));
    return Status();
  };
  TS_RETURN_IF_ERROR(positive("--batch", o.batch));
  TS_RETURN_IF_ERROR(positive("--seq", o.seq));
  TS_RETURN_IF_ERROR(positive("--steps", o.steps));
  TS_RETURN_IF_ERROR(positive("--grad-accum", o.grad_accum));
  TS_RETURN_IF_ERROR(positive("--tp", o.tp));
  const std::optional<DType> precision = parse_dtype(o.precision);
  if (!precision || *precision == DType::i32)
    return error("--precision must be fp32, bf16 or fp16 (or f32, f16), got '" + o.precision + "'");
  if (*precision != DType::f32 && cfg.family != "gpt" && cfg.family != "llama")
    return error("--precision " + o.precision + " trains GPT and LLaMA models; " + cfg.name +
                     " is a " + cfg.family + " model",
                 "train it with --precision fp32");
  if (o.seq > cfg.max_seq_len)
    return error("--seq " + std::to_string(o.seq) + " exceeds max_seq_len " +
                     std::to_string(cfg.max_seq_len) + " of model " + cfg.name,
                 "use --seq <= " + std::to_string(cfg.max_seq_len));
  if (task_of(cfg) == ModelTask::language_model && o.data.empty() &&
      cfg.vocab_size < kGpt2VocabSize)
    return error("model vocab_size " + std::to_string(cfg.vocab_size) +
                     " is smaller than the GPT-2 tokenizer's 50257, which the shipped corpus is "
                     "tokenized with",
                 "train a config with vocab_size >= 50257, or tokenize a text with this model's "
                 "tokenizer (tessera tokenize --tokenizer PATH) and pass --data DIR");
  if (task_of(cfg) == ModelTask::span_corruption &&
      cfg.vocab_size < kGpt2VocabSize + kT5ExtraTokens)
    return error("model " + cfg.name + " has vocab_size " + std::to_string(cfg.vocab_size) +
                     "; span corruption on the corpus needs the GPT-2 tokenizer's 50257 ids, " +
                     std::to_string(kT5Sentinels) + " sentinels and a start token, " +
                     std::to_string(kGpt2VocabSize + kT5ExtraTokens) + " in all",
                 "train t5-tiny, or a config with vocab_size >= " +
                     std::to_string(kGpt2VocabSize + kT5ExtraTokens) +
                     " (the T5 checkpoints' 32128-id SentencePiece vocabulary is not the "
                     "corpus's)");
  if (task_of(cfg) == ModelTask::span_corruption && o.sequence_parallel && o.tp > 1 && o.seq >= 2) {
    // Sequence parallelism splits the encoder's and the decoder's sequences.
    auto splits = [&](int64_t raw) {
      const SpanCorruption sc = span_corruption(raw);
      return sc.encoder_len() % o.tp == 0 && sc.decoder_len() % o.tp == 0;
    };
    if (!splits(o.seq)) {
      int64_t near = o.seq + 1;
      while (near < cfg.max_seq_len && !splits(near)) ++near;
      const SpanCorruption sc = span_corruption(o.seq);
      return error("--sequence-parallel: --seq " + std::to_string(o.seq) + " of " + cfg.name +
                       " gives an encoder sequence of " + std::to_string(sc.encoder_len()) +
                       " and a decoder sequence of " + std::to_string(sc.decoder_len()) +
                       " tokens; both must split over --tp " + std::to_string(o.tp),
                   splits(near) ? "use --seq " + std::to_string(near) : "drop --sequence-parallel");
    }
  }
  if (!(o.lr > 0) || !std::isfinite(o.lr))
    return error("--lr must be a positive finite number, got " + number_text(o.lr));
  TS_RETURN_IF_ERROR(positive("--eval-batches", o.eval_batches));
  auto at_least_zero = [](const char* flag, double v) -> Status {
    if (!(v >= 0) || !std::isfinite(v))
      return error(std::string(flag) + " must be 0 or more, got " + number_text(v));
    return Status();
  };
  for (auto [flag, v] : {std::pair{"--warmup", static_cast<double>(o.warmup)},
                         std::pair{"--eval-every", static_cast<double>(o.eval_every)},
                         std::pair{"--ckpt-every", static_cast<double>(o.ckpt_every)},
                         std::pair{"--keep-ckpts", static_cast<double>(o.keep_ckpts)},
                         std::pair{"--log-every", static_cast<double>(o.log_every)},
                         std::pair{"--sample-tokens", static_cast<double>(o.sample_tokens)},
                         std::pair{"--stop-after", static_cast<double>(o.stop_after)},
                         std::pair{"--weight-decay", o.weight_decay}, std::pair{"--clip", o.clip},
                         std::pair{"--peak-flops", o.peak_flops}})
    TS_RETURN_IF_ERROR(at_least_zero(flag, v));
  // A peak below any device's is a unit slip (TFLOP/s meant): MFU would be in the billions of %.
  if (o.peak_flops > 0 && o.peak_flops < 1e9)
    return error("--peak-flops " + number_text(o.peak_flops) +
                     " FLOP/s is below any device's peak (the MFU would exceed 100%)",
                 "give FLOP/s per rank, e.g. 9.89e14 for an H100's dense bf16 peak, or leave it "
                 "out to measure a GEMM");
  if (!(o.min_lr_frac >= 0 && o.min_lr_frac <= 1))
    return error("--min-lr-frac must be between 0 and 1, got " + number_text(o.min_lr_frac));
  if (!(o.comm_timeout > 0) || !std::isfinite(o.comm_timeout))
    return error("--comm-timeout must be a positive number of seconds, got " +
                 number_text(o.comm_timeout));
  if (!o.recompute.empty()) {
    Result<RecomputePolicy> r = parse_recompute(o.recompute);
    if (!r.ok()) return error("--recompute: " + r.status().message(), r.status().hint());
  }
  if (!o.offload.empty()) {
    Result<OffloadPolicy> r = parse_offload(o.offload);
    if (!r.ok()) return error("--offload: " + r.status().message(), r.status().hint());
  }
  if (o.trace_step != 0 && o.trace.empty())
    return error("--trace-step " + std::to_string(o.trace_step) + " without --trace",
                 "add --trace FILE (the step's Chrome/Perfetto trace goes there)");
  if (o.trace_step < 0 || o.trace_step > o.steps)
    return error("--trace-step " + std::to_string(o.trace_step) +
                 " is not a step of this run (1 to --steps " + std::to_string(o.steps) + ")");
  return Status();
}

}  // namespace tessera
