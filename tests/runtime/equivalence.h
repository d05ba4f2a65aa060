// Shared by the distributed equivalence tests (in-process ranks and MPI ranks): trains one
// tiny GPT (or LLaMA) for a few steps on one process (a plan of one rank) and on N ranks under
// a Plan, both through the StepRunner, on the same global batches, and returns what is compared.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ir/op.h"
#include "models/model.h"
#include "parallel/sharding_search.h"
#include "runtime/step_runner.h"

namespace tessera::testing_equivalence {

inline ModelConfig tiny_gpt() {
  ModelConfig c;
  c.name = "equivalence-gpt";
  c.vocab_size = 96;
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.max_seq_len = 16;
  return c;
}

// GQA (2 KV heads for 4 heads), SwiGLU, RoPE, an untied head.
inline ModelConfig tiny_llama() {
  ModelConfig c = tiny_gpt();
  c.name = "equivalence-llama";
  c.family = "llama";
  c.n_kv_head = 2;
  c.ffn_hidden = 64;
  c.tied_embeddings = false;
  return c;
}

// The Megatron layout of a LLaMA model on the tensor axis of `plan`, written by hand: q, k, v,
// gate and up column-parallel (Shard(0) of [out, in]), o and down row-parallel (Shard(1));
// the embedding and the head vocab-parallel (Shard(0) of [vocab, C]); norms Replicate.
// with_searched_layout finds it (and GPT's) instead.
inline Plan with_megatron_llama(Plan plan, const ModelConfig& c) {
  const size_t tp = static_cast<size_t>(plan.mesh.axis_index(plan.tensor_axes.at(0)));
  for (const char* vocab : {"tok_emb", "lm_head.weight"}) {
    plan.params[vocab] = plan.placements_of("");
    plan.params[vocab][tp] = Placement::shard(0);
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    for (const char* col : {"attn.q", "attn.k", "attn.v", "mlp.gate", "mlp.up"}) {
      plan.params[h + col + ".weight"] = plan.placements_of("");
      plan.params[h + col + ".weight"][tp] = Placement::shard(0);
    }
    for (const char* row : {"attn.o", "mlp.down"}) {
      plan.params[h + row + ".weight"] = plan.placements_of("");
      plan.params[h + row + ".weight"][tp] = Placement::shard(1);
    }
  }
  return plan;
}

constexpr int64_t kBatch = 8, kSeq = 8;  // global micro-batch

// The placements the sharding search picks for model `c` on the tensor axis of `plan` when
// bytes cost nothing (so it shards every matrix it can: the Megatron layout, which is what
// these tests exercise; sharding_search_test checks the choice at real FLOP/byte ratios).
inline Plan with_searched_layout(Plan plan, const ModelConfig& c) {
  ModelConfig one = c;
  one.n_layer = 1;
  ModelGraph block = build_model(one, kBatch, kSeq, ModelMode::train);
  ModelGraph all = build_model(c, kBatch, kSeq, ModelMode::train);
  Result<BlockLayout> b = search_block_layout(block.graph, plan, SearchCost{0});
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (!b.ok()) return plan;
  plan.params = expand_block_layout(*b, all.graph, plan).value();
  return plan;
}

// Two context-parallel ranks, the keys and values gathered or passed round the ring, each
// sequence cut contiguously or in zigzag halves.
inline std::vector<Plan> context_parallel_plans() {
  std::vector<Plan> plans;
  for (ContextAttention how : {ContextAttention::gather, ContextAttention::ring})
    for (ContextOrder order : {ContextOrder::contiguous, ContextOrder::zigzag}) {
      Plan p = Plan::data_parallel(1);
      EXPECT_TRUE(add_context_axis(&p, 2).ok());
      p.context_attention = how;
      p.context_order = order;
      plans.push_back(p);
    }
  return plans;
}

constexpr uint64_t kSeed = 7;
constexpr double kLr = 2e-3;

struct RunResult {
  std::vector<float> losses;
  std::vector<double> norms;               // pre-clip gradient norm per step
  std::vector<std::vector<float>> params;  // whole tensors, global parameter order
  double comm_bytes_measured = 0;          // sent by this rank in the last step
  double comm_bytes_planned = 0;
  int64_t arena_planned = 0, arena_measured = 0;
  int64_t persistent_bytes = 0;
  // The loss of a held-out global batch after training, evaluated under the plan
  // (StepRunner::evaluate), and the evaluation arena planned and measured.
  float eval_loss = 0;
  int64_t eval_arena_planned = 0, eval_arena_measured = 0;
};

// Global batch of step s, micro-batch m: deterministic tokens and targets (B*T each) in
// [0, vocab).
inline void global_batch(int step, int micro, std::vector<int32_t>* x, std::vector<int32_t>* y,
                         int64_t vocab = tiny_gpt().vocab_size) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * step + micro + 1));
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab) - 1);
  x->resize(kBatch * kSeq);
  y->resize(kBatch * kSeq);
  for (auto& t : *x) t = tok(rng);
  for (auto& t : *y) t = tok(rng);
}

inline AdamWConfig adamw() {
  AdamWConfig c;
  c.lr = kLr;
  c.weight_decay = 0.1;
  return c;
}

// What rank `rank` of `plan` takes of a global batch x [kBatch, kSeq]: its data group's rows,
// whole, or with a context axis its chunk of each of them, cut as the trainer cuts them
// (contiguous or zigzag: op.h's sequence_position).
inline std::vector<int32_t> rank_part(const std::vector<int32_t>& x, const Plan& plan, int rank) {
  const int64_t rows = kBatch / plan.data_group();
  const int64_t row0 = plan.mesh.group_index(rank, plan.data_axes) * rows;
  const int chunks = plan.context_group();
  if (chunks <= 1) return {x.begin() + row0 * kSeq, x.begin() + (row0 + rows) * kSeq};
  const int chunk = plan.mesh.group_index(rank, {plan.context_axis});
  const int64_t len = kSeq / chunks,
                zigzag = plan.context_order == ContextOrder::zigzag ? chunks : 0;
  std::vector<int32_t> part;
  for (int64_t r = row0; r < row0 + rows; ++r)
    for (int64_t t = 0; t < len; ++t)
      part.push_back(x[static_cast<size_t>(r * kSeq + sequence_position(t, chunk, len, zigzag))]);
  return part;
}

// Evaluates the held-out batch (step 1000's) under the runner's plan, from this rank's part.
inline void evaluate_held_out(StepRunner& step, const Plan& plan, int rank, int64_t vocab,
                              RunResult* r) {
  std::vector<int32_t> x, y;
  global_batch(1000, 0, &x, &y, vocab);
  x = rank_part(x, plan, rank);
  y = rank_part(y, plan, rank);
  step.eval_executor()->paint_arena();
  Result<float> loss = step.evaluate(token_feed(x.data(), y.data()));
  EXPECT_TRUE(loss.ok()) << loss.status().to_string();
  r->eval_loss = loss.ok() ? loss.value() : 0.0f;
  r->eval_arena_measured = step.eval_executor()->measured_high_water();
  r->eval_arena_planned = step.eval_executor()->plan().arena_bytes;
}

// One process: the step runner on a plan of one rank (on `backend`; null: the CPU backend).
inline RunResult run_single(int steps, int micro_batches, const ModelConfig& cfg = tiny_gpt(),
                            Backend* backend = nullptr) {
  CpuBackend cpu;
  ModelGraph m = build_model(cfg, kBatch, kSeq, ModelMode::train);
  ModelGraph em = build_model(cfg, kBatch, kSeq, ModelMode::loss);
  Plan plan = Plan::data_parallel(1);
  plan.micro_batches = micro_batches;
  Result<MeshComms> comms = MeshComms::single(plan);
  EXPECT_TRUE(comms.ok()) << comms.status().to_string();
  auto made = StepRunner::create(m.graph, plan, backend ? *backend : cpu, comms.value(), adamw());
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  RunResult r;
  if (!made.ok()) return r;
  StepRunner& step = *made.value();
  EXPECT_TRUE(step.add_evaluation(em.graph).ok());
  step.init_params(kSeed);
  std::vector<int32_t> x, y;
  for (int s = 0; s < steps; ++s) {
    float loss = 0;
    for (int k = 0; k < micro_batches; ++k) {
      global_batch(s, k, &x, &y, cfg.vocab_size);
      loss += step.forward_backward(token_feed(x.data(), y.data())).value();
    }
    Result<double> norm = step.apply(kLr, /*clip=*/0.5);
    EXPECT_TRUE(norm.ok()) << norm.status().to_string();
    r.norms.push_back(norm.ok() ? *norm : 0.0);
    r.losses.push_back(loss / static_cast<float>(micro_batches));
  }
  for (const Instruction& in : step.program().micro_step)
    EXPECT_EQ(in.kind, Instruction::compute) << "one rank: no collectives";
  evaluate_held_out(step, plan, 0, cfg.vocab_size, &r);
  for (size_t i = 0; i < m.graph.params().size(); ++i) r.params.push_back(step.read_param(i));
  return r;
}

// Runs on one rank of `world` (on `backend`; null: the CPU backend); every rank returns the
// same losses and whole parameters.
inline RunResult run_rank(Communicator& world, const Plan& plan, int steps,
                          const ModelConfig& cfg = tiny_gpt(), Backend* backend = nullptr) {
  RunResult r;
  CpuBackend cpu;
  ModelGraph m = build_model(cfg, kBatch, kSeq, ModelMode::train);
  ModelGraph em = build_model(cfg, kBatch, kSeq, ModelMode::loss);
  Result<MeshComms> comms = MeshComms::create(world, plan);
  EXPECT_TRUE(comms.ok()) << comms.status().to_string();
  if (!comms.ok()) return r;
  auto made = StepRunner::create(m.graph, plan, backend ? *backend : cpu, comms.value(), adamw());
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  if (!made.ok()) return r;
  StepRunner& step = *made.value();
  Status eval = step.add_evaluation(em.graph);
  EXPECT_TRUE(eval.ok()) << eval.to_string();
  if (!eval.ok()) return r;
  step.init_params(kSeed);
  std::vector<int32_t> x, y;
  for (int s = 0; s < steps; ++s) {
    if (s == steps - 1) {
      comms.value().reset_stats();
      step.executor().paint_arena();
    }
    float loss = 0;
    for (int k = 0; k < plan.micro_batches; ++k) {
      global_batch(s, k, &x, &y, cfg.vocab_size);
      x = rank_part(x, plan, world.rank());
      y = rank_part(y, plan, world.rank());
      Result<float> l = step.forward_backward(token_feed(x.data(), y.data()));
      EXPECT_TRUE(l.ok()) << l.status().to_string();
      if (!l.ok()) return r;
      loss += l.value();
    }
    if (s == steps - 1) r.arena_measured = step.executor().measured_high_water();
    Result<double> norm = step.apply(kLr, 0.5);
    EXPECT_TRUE(norm.ok()) << norm.status().to_string();
    r.losses.push_back(loss / static_cast<float>(plan.micro_batches));
  }
  r.comm_bytes_measured = static_cast<double>(comms.value().bytes_sent());
  r.comm_bytes_planned = step.program().comm_bytes_per_step;
  r.arena_planned = step.program().memory.arena_bytes;
  r.persistent_bytes = step.program().persistent_bytes();
  evaluate_held_out(step, plan, world.rank(), cfg.vocab_size, &r);
  Status s = step.gather_params(&r.params);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return r;
}

// Losses within 1e-5 relative, parameters within 5e-5 absolute. AdamW divides each update by
// the gradient's running RMS, so a component whose gradient is near zero moves by up to lr
// (2e-3) a step whatever its size: float reassociation (a sum split over ranks) shows in the
// parameters at up to a few percent of lr after 8 steps, while a wrong gradient moves them by
// whole lr steps.
inline void expect_equivalent(const RunResult& ref, const RunResult& got) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << "step " << i;
  ASSERT_EQ(got.params.size(), ref.params.size());
  double worst = 0;
  for (size_t i = 0; i < ref.params.size(); ++i) {
    ASSERT_EQ(got.params[i].size(), ref.params[i].size()) << "param " << i;
    for (size_t k = 0; k < ref.params[i].size(); ++k)
      worst = std::max(worst, static_cast<double>(std::abs(got.params[i][k] - ref.params[i][k])));
  }
  EXPECT_LE(worst, 5e-5) << "largest parameter difference";
  EXPECT_NEAR(got.eval_loss, ref.eval_loss, 1e-5 * std::abs(ref.eval_loss)) << "held-out loss";
  EXPECT_GT(ref.eval_loss, 0.0f);
  EXPECT_EQ(got.eval_arena_measured, got.eval_arena_planned) << "evaluation arena";
  if (std::getenv("TESSERA_VERBOSE")) std::printf("largest parameter difference %.3g\n", worst);
}

}  // namespace tessera::testing_equivalence
