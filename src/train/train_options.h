// The options of a training run (`tessera train`'s flags, one field per flag) and their
// checks. A field's error names its flag.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "models/model.h"

namespace tessera {

struct TrainOptions {
  std::string model = "gpt-mini";  // preset name or config.toml
  std::string data;  // language models: directory with train.bin / val.bin ("" = shipped
                     // corpus); image models: a folder of IDX files ("" or "fashion-mnist":
                     // Debian's dataset-fashion-mnist)
  std::string out = "runs/default";
  int64_t batch = 8;
  int64_t seq = 128;
  int64_t steps = 500;
  int64_t grad_accum = 1;
  int64_t warmup = 25;
  double lr = 2e-3;
  double min_lr_frac = 0.1;
  double weight_decay = 0.1;
  double clip = 1.0;
  int64_t eval_every = 100;
  int64_t eval_batches = 8;
  int64_t ckpt_every = 100;
  int64_t keep_ckpts = 3;
  int64_t log_every = 10;
  int64_t sample_tokens = 64;
  uint64_t seed = 1337;
  bool resume = false;
  std::string init_from;     // --init-from: a checkpoint whose parameters start a new run
  bool model_given = false;  // --model was on the command line (not the default)
  bool seq_given = false;    // --seq was (image models take their own: image tokens)
  int64_t stop_after = 0;    // stop (with a checkpoint) after this many steps of this run; 0: off
  // Distributed (under mpirun): --batch is the global micro-batch, split over the data ranks.
  int dp = 0;        // data-parallel ranks (0: the MPI world size / tp)
  int tp = 1;        // tensor-parallel ranks (consecutive ranks; innermost mesh axis)
  int zero = 0;      // ZeRO stage 0-3
  int hsdp = 0;      // > 0: HSDP with this many replica groups (ZeRO-3 inside each)
  std::string plan;  // plan JSON file (overrides --dp/--zero/--hsdp), or "auto"
  std::string cluster = "cpu-local";  // --plan auto: the spec the planner times plans on
  std::string recompute;  // "none" | "full" | "selective" ("": the plan's, none without one)
  bool sequence_parallel = false;
  int pp = 1;                        // pipeline stages (the outermost mesh axis)
  int cp = 1;                        // context-parallel ranks (--cp)
  std::string cp_order;              // --cp-order contiguous|zigzag ("": the plan's)
  std::string cp_attention;          // --cp-attention gather|ring ("": the plan's)
  int ep = 1;                        // expert-parallel ranks (--ep)
  std::string schedule;              // --schedule: gpipe | 1f1b | interleaved | zb-h1 ("": 1f1b)
  int virtual_stages = -1;           // --virtual-stages (interleaved); -1: not given (1)
  std::string stage_layers;          // --stage-layers "a,b,...": blocks per model chunk
  int recompute_layers = -1;         // --recompute-layers: the first N blocks; -1: the plan's
  std::string offload;               // --offload none|optimizer ("": the plan's, none without one)
  double comm_timeout = 30;          // seconds a collective waits for a peer before failing
  std::string collectives = "auto";  // --collectives: auto | ring | mpi (comm/host_comm.h)
  std::string trace;                 // --trace FILE: a Chrome/Perfetto trace of one step ("": none)
  int64_t trace_step = 0;  // --trace-step N (1-based); 0: this run's second step (or its only)
  bool sync_checkpoints = false;  // --sync-checkpoints: written while the training waits
  double peak_flops = 0;          // per rank, for MFU (0: measured with a GEMM at the start)
  // --precision: "fp32", "bf16" or "fp16" (parameters, activations and gradients in it; f32
  // master weights and AdamW state; fp16 with dynamic loss scaling; GPT and LLaMA models, any
  // plan but pipelines).
  std::string precision = "fp32";
  std::string device = "cpu";  // --device: cpu, or cuda (one GPU, one process)
};

// Checks every number against its range and the model (--seq against max_seq_len, the
// vocabulary against the GPT-2 tokenizer's): one error naming the flag.
Status check_train_options(const TrainOptions& o, const ModelConfig& cfg);

// A flag's value as written (1e-3, 0.5, 2), for error messages.
std::string number_text(double v);

}  // namespace tessera
