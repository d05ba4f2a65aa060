// Data-axis plans on in-process ranks (threads over the local transport) against one rank:
// same losses and parameters, planned = measured arena, analytic = measured bytes sent.
#include <cstring>
#include <thread>

#include "backend/null_backend.h"
#include "comm/local_comm.h"
#include "equivalence.h"
#include "opaque_backend.h"
#include "sim/simulator.h"

namespace tessera {
namespace {

using namespace testing_equivalence;

std::vector<RunResult> run_threads(const Plan& plan, int steps,
                                   const ModelConfig& cfg = tiny_gpt()) {
  const int n = plan.mesh.size();
  std::vector<std::unique_ptr<Communicator>> comms = make_local_comms(n);
  std::vector<RunResult> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back(
        [&, r] { out[static_cast<size_t>(r)] = run_rank(*comms[r], plan, steps, cfg); });
  for (std::thread& t : threads) t.join();
  return out;
}

struct Case {
  const char* name;
  Plan plan;
};

class StepRunnerTest : public testing::TestWithParam<Case> {};

// Every rank: the 1-rank losses and parameters, planned = measured arena, and analytic =
// measured bytes sent (ring chunking rounds each collective's bytes by a few elements).
void expect_ranks_match(const Plan& plan, int steps, const ModelConfig& cfg) {
  RunResult ref = run_single(steps, plan.micro_batches, cfg);
  std::vector<RunResult> ranks = run_threads(plan, steps, cfg);
  for (size_t r = 0; r < ranks.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    expect_equivalent(ref, ranks[r]);
    EXPECT_EQ(ranks[r].arena_measured, ranks[r].arena_planned);
    EXPECT_NEAR(ranks[r].comm_bytes_measured, ranks[r].comm_bytes_planned,
                0.002 * ranks[r].comm_bytes_planned + 64);
  }
}

TEST_P(StepRunnerTest, MatchesOneRank) { expect_ranks_match(GetParam().plan, 10, tiny_gpt()); }

Plan with_micro(Plan p, int k) {
  p.micro_batches = k;
  return p;
}

Plan with_recompute(Plan p, RecomputePolicy policy = RecomputePolicy::full) {
  p.recompute = policy;
  return p;
}

Plan with_recompute_layers(Plan p, int layers) {
  p.recompute_layers = layers;
  return p;
}

Plan with_sequence_parallel(Plan p) {
  p.sequence_parallel = true;
  return p;
}

// Every gather and scatter of a split with dims before it run piece by piece (one collective
// per example under sequence parallelism), however small the pieces.
Plan piece_by_piece(Plan p) {
  p.piece_bytes = 0;
  return p;
}

INSTANTIATE_TEST_SUITE_P(
    Plans, StepRunnerTest,
    testing::Values(Case{"dp2", Plan::data_parallel(2)}, Case{"zero1_2", Plan::data_parallel(2, 1)},
                    Case{"zero2_4", Plan::data_parallel(4, 2)},
                    Case{"zero3_4", Plan::data_parallel(4, 3)},
                    Case{"hsdp_2x2", Plan::hybrid_sharded(2, 2)},
                    Case{"zero3_2_accum", with_micro(Plan::data_parallel(2, 3), 2)},
                    Case{"zero3_2_recompute", with_recompute(Plan::data_parallel(2, 3))},
                    Case{"zero3_2_recompute_first_block",
                         with_recompute_layers(with_recompute(Plan::data_parallel(2, 3)), 1)}),
    [](const testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// Each rank of `b` ran `a`'s steps to the bit: losses and parameters, and its planned arena.
void expect_bitwise_same(const std::vector<RunResult>& a, const std::vector<RunResult>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(a[r].losses.size(), b[r].losses.size());
    for (size_t s = 0; s < a[r].losses.size(); ++s)
      EXPECT_EQ(std::memcmp(&a[r].losses[s], &b[r].losses[s], sizeof(float)), 0) << "step " << s;
    ASSERT_EQ(a[r].params.size(), b[r].params.size());
    for (size_t i = 0; i < a[r].params.size(); ++i)
      EXPECT_EQ(a[r].params[i], b[r].params[i]) << "parameter " << i;
    EXPECT_EQ(b[r].arena_measured, b[r].arena_planned);
  }
}

// Recomputation under ZeRO-3 (clones read parameters gathered again for the backward pass):
// the same losses and parameters as without, bit for bit, on each rank.
TEST(StepRunner, RecomputeIsBitwiseTheSameUnderZeroThree) {
  const Plan plain = Plan::data_parallel(2, 3);
  expect_bitwise_same(run_threads(plain, 3), run_threads(with_recompute(plain), 3));
}

// The fused ops (parallel/fuse.h) do in f32 what the unfused ops do, to the bit: data parallel
// with ZeRO-3 and recomputation, and tensor parallel (column blocks of a bias).
TEST(StepRunner, FusedEpiloguesMatchTheUnfusedOpsBitForBit) {
  for (Plan plain : {with_recompute(Plan::data_parallel(2, 3)),
                     with_searched_layout(Plan::tensor_parallel(1, 2), tiny_gpt())}) {
    plain.fuse = false;
    Plan fused = plain;
    fused.fuse = true;
    expect_bitwise_same(run_threads(plain, 3), run_threads(fused, 3));
  }
  // LLaMA's residual rmsnorms.
  Plan plain = Plan::data_parallel(2, 1);
  plain.fuse = false;
  expect_bitwise_same(run_threads(plain, 3, tiny_llama()),
                      run_threads(Plan::data_parallel(2, 1), 3, tiny_llama()));
}

// Tensor parallelism: LLaMA (GQA) under the Megatron layout, alone and with data parallelism
// and ZeRO, against one rank.
class TensorParallelTest : public testing::TestWithParam<Case> {};

TEST_P(TensorParallelTest, LlamaMatchesOneRank) {
  Plan plan = with_searched_layout(GetParam().plan, tiny_llama());
  const Plan megatron = with_megatron_llama(GetParam().plan, tiny_llama());
  // Under sequence parallelism this tiny model's feed-forward weights cost less whole (each
  // rank computes its part of the sequence; their gradients are all-reduced once) than split,
  // so the search may keep them whole: both layouts must match one rank.
  if (!plan.sequence_parallel) {
    EXPECT_EQ(plan.params, megatron.params);
  }
  expect_ranks_match(plan, 8, tiny_llama());
  if (plan.params != megatron.params) expect_ranks_match(megatron, 8, tiny_llama());
}

// GPT's fused QKV projection split per head (whole heads of q, k and v on each rank), with
// its bias; the fc bias follows fc; the tied embedding and head vocab-parallel.
TEST_P(TensorParallelTest, GptMatchesOneRank) {
  Plan plan = with_searched_layout(GetParam().plan, tiny_gpt());
  const size_t tp = static_cast<size_t>(plan.mesh.axis_index("tp"));
  ASSERT_EQ(plan.params.at("wte")[tp], Placement::shard(0));
  for (const char* col : {"h.1.attn.qkv.weight", "h.1.attn.qkv.bias", "h.1.mlp.fc.bias"})
    ASSERT_EQ(plan.params.at(col)[tp], Placement::shard(0)) << col;
  ASSERT_EQ(plan.params.at("h.1.attn.proj.weight")[tp], Placement::shard(1));
  expect_ranks_match(plan, 8, tiny_gpt());
}

INSTANTIATE_TEST_SUITE_P(
    Plans, TensorParallelTest,
    testing::Values(
        Case{"tp2", Plan::tensor_parallel(1, 2)}, Case{"dp2_tp2", Plan::tensor_parallel(2, 2)},
        Case{"dp2_tp2_zero1", Plan::tensor_parallel(2, 2, 1)},
        Case{"dp2_tp2_zero2", Plan::tensor_parallel(2, 2, 2)},
        Case{"dp2_tp2_zero3", Plan::tensor_parallel(2, 2, 3)},
        Case{"hsdp_2x2_tp2", Plan::hybrid_sharded(2, 2, 2)},
        Case{"tp2_accum", with_micro(Plan::tensor_parallel(1, 2), 2)},
        Case{"tp2_recompute", with_recompute(Plan::tensor_parallel(1, 2))},
        Case{"tp2_selective_first_block",
             with_recompute_layers(
                 with_recompute(Plan::tensor_parallel(1, 2), RecomputePolicy::selective), 1)},
        Case{"dp2_tp2_zero3_selective",
             with_recompute(Plan::tensor_parallel(2, 2, 3), RecomputePolicy::selective)},
        Case{"tp2_sp", with_sequence_parallel(Plan::tensor_parallel(1, 2))},
        Case{"tp2_sp_pieces", piece_by_piece(with_sequence_parallel(Plan::tensor_parallel(1, 2)))},
        Case{"dp2_tp2_zero3_sp_pieces",
             piece_by_piece(with_sequence_parallel(Plan::tensor_parallel(2, 2, 3)))},
        Case{"dp2_tp2_zero3_sp_selective",
             with_sequence_parallel(with_recompute(Plan::tensor_parallel(2, 2, 3),
                                                   RecomputePolicy::selective))}),
    [](const testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// The head split on its columns (row-parallel): its input is sliced locally on each rank
// (shard_slice at the rank's coordinate), the logits all-reduced; the embedding table split on
// its columns too (each rank looks up its slice of every row, then an all-gather).
TEST(TensorParallel, HeadAndEmbeddingSplitOnTheirColumnsMatchOneRank) {
  Plan plan = with_megatron_llama(Plan::tensor_parallel(1, 2), tiny_llama());
  plan.params["lm_head.weight"][1] = Placement::shard(1);
  plan.params["tok_emb"][1] = Placement::shard(1);
  expect_ranks_match(plan, 6, tiny_llama());
}

// A 94-word vocabulary padded to 96 rows: vocab-parallel over 2 and 4 ranks, the padding
// columns never a target nor a probability, the same losses and parameters as one rank.
TEST(TensorParallel, PaddedVocabularyIsVocabParallel) {
  ModelConfig c = tiny_gpt();
  c.vocab_size = 94;
  c.padded_vocab_size = 96;
  for (int tp : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    Plan plan = with_searched_layout(Plan::tensor_parallel(1, tp), c);
    ASSERT_EQ(plan.params.at("wte")[1], Placement::shard(0));
    expect_ranks_match(plan, 6, c);
  }
}

// Context parallelism through the runner directly (the CLI tests run it through the trainer):
// each rank fed its chunk of every sequence (rank_part), attention's keys and values gathered
// or passed round the ring, contiguous or zigzag, follows one rank. The CUDA runner's test runs
// these plans on a GPU against the CPU.
TEST(ContextParallel, RanksFedTheirChunksMatchOneRank) {
  for (const Plan& plan : context_parallel_plans()) {
    SCOPED_TRACE(plan.describe());
    expect_ranks_match(plan, 4, tiny_llama());
  }
}

TEST(TensorParallel, KvHeadsThatDoNotSplitAreAnErrorNamingTheDegrees) {
  Plan plan = with_megatron_llama(Plan::tensor_parallel(1, 4), tiny_llama());
  ModelGraph m = build_model(tiny_llama(), kBatch, kSeq, ModelMode::train);
  Result<Program> p = lower(m.graph, plan);
  ASSERT_FALSE(p.ok());
  std::printf("%s\n", p.status().to_string().c_str());
  EXPECT_NE(p.status().message().find("cannot be split 4 ways over tp"), std::string::npos);
}

// bf16 and fp16 (loss-scaled) under data, ZeRO and tensor parallelism: collectives of
// low-precision values travel as f32 and are rounded once; the f32 master weights are synced
// by ZeRO-1/2. N ranks follow one rank of the same precision within its rounding (sums split
// over ranks round differently), not bitwise.
TEST(StepRunner, LowPrecisionRanksFollowOneRank) {
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    ModelConfig cfg = tiny_gpt();
    cfg.dtype = low;
    const RunResult ref = run_single(6, 1, cfg);
    for (const Plan& plan :
         {Plan::data_parallel(2), Plan::data_parallel(2, 1), Plan::data_parallel(2, 2),
          Plan::data_parallel(2, 3), with_searched_layout(Plan::tensor_parallel(1, 2), cfg),
          with_searched_layout(Plan::tensor_parallel(2, 2, 3), cfg)}) {
      SCOPED_TRACE(plan.describe());
      std::vector<RunResult> ranks = run_threads(plan, 6, cfg);
      for (const RunResult& r : ranks) {
        ASSERT_EQ(r.losses.size(), ref.losses.size());
        for (size_t s = 0; s < ref.losses.size(); ++s)
          EXPECT_NEAR(r.losses[s], ref.losses[s], 5e-3 * ref.losses[s]) << "step " << s;
        EXPECT_NEAR(r.eval_loss, ref.eval_loss, 5e-3 * ref.eval_loss);
        double worst = 0, sum = 0;
        int64_t n = 0;
        for (size_t i = 0; i < ref.params.size(); ++i)
          for (size_t k = 0; k < ref.params[i].size(); ++k) {
            const double d = std::abs(r.params[i][k] - ref.params[i][k]);
            worst = std::max(worst, d);
            sum += d;
            ++n;
          }
        if (std::getenv("TESSERA_VERBOSE"))
          std::printf(
              "%s: largest parameter difference %.3g, mean %.3g; bytes sent %.0f, "
              "planned %.0f\n",
              plan.describe().c_str(), worst, sum / static_cast<double>(n), r.comm_bytes_measured,
              r.comm_bytes_planned);
        EXPECT_LE(sum / static_cast<double>(n), 2e-4) << "mean parameter difference";
        // An element whose bf16 gradient rounds to the other sign moves the other way: at most
        // one lr-sized AdamW step apart per step each way.
        EXPECT_LE(worst, 12 * kLr) << "a parameter moved further than six steps of lr each way";
        EXPECT_EQ(r.arena_measured, r.arena_planned);
      }
    }
  }
}

TEST(StepRunner, ZeroThreeHoldsOneNthOfDataParallelState) {
  Plan dp = Plan::data_parallel(4), z3 = Plan::data_parallel(4, 3);
  ModelGraph m = build_model(tiny_gpt(), kBatch, kSeq, ModelMode::train);
  const int64_t a = lower(m.graph, dp).value().persistent_bytes();
  const int64_t b = lower(m.graph, z3).value().persistent_bytes();
  EXPECT_NEAR(static_cast<double>(b) / static_cast<double>(a), 0.25, 0.01);
}

// The runtime asks the backend for exactly the memory the simulator predicts per device, on a
// full-size model: GPT-2 XL (1.56 B parameters) set up on 4 ranks of the NULL backend, which
// allocates nothing, under ZeRO-1 with gradient accumulation, ZeRO-3, and dp 2 x tp 2 ZeRO-1.
TEST(StepRunner, AllocatesWhatTheSimulatorPredictsForAFullSizeModel) {
  const ModelConfig xl = *find_preset("gpt2-xl");
  ModelGraph m = build_model(xl, 4, 1024, ModelMode::train);
  const ClusterSpec cluster = load_cluster("dgx-a100").value();
  for (const Plan& plan : {with_micro(Plan::data_parallel(4, 1), 2), Plan::data_parallel(4, 3),
                           with_searched_layout(Plan::tensor_parallel(2, 2, 1), xl)}) {
    SCOPED_TRACE(plan.describe());
    std::vector<std::unique_ptr<Communicator>> comms = make_local_comms(4);
    std::vector<int64_t> in_use(4, -1), predicted(4, -2), planned(4, -3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r)
      threads.emplace_back([&, r] {
        NullBackend null;
        Result<MeshComms> mc = MeshComms::create(*comms[static_cast<size_t>(r)], plan);
        if (!mc.ok()) return;
        auto step = StepRunner::create(m.graph, plan, null, mc.value(), adamw());
        if (!step.ok()) return;
        const Program& prog = step.value()->program();
        in_use[static_cast<size_t>(r)] = null.bytes_in_use();
        planned[static_cast<size_t>(r)] = prog.persistent_bytes() + prog.memory.arena_bytes;
        predicted[static_cast<size_t>(r)] =
            static_cast<int64_t>(simulate(prog, cluster, SimOptions{}).value().peak_memory_bytes);
      });
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(in_use[static_cast<size_t>(r)], planned[static_cast<size_t>(r)]) << "rank " << r;
      EXPECT_EQ(in_use[static_cast<size_t>(r)], predicted[static_cast<size_t>(r)]) << "rank " << r;
    }
    EXPECT_GT(in_use[0], int64_t{1} << 30);  // gigabytes that were never allocated
    if (std::getenv("TESSERA_VERBOSE"))
      std::printf("%s: rank 0 allocates %lld bytes, the simulator predicts %lld\n",
                  plan.describe().c_str(), static_cast<long long>(in_use[0]),
                  static_cast<long long>(predicted[0]));
  }
}

// The one-rank step (forward, backward, gradient accumulation, clipping, AdamW, fp16 loss
// scaling, evaluation) touches memory only through the Backend: on a backend whose buffers
// the host cannot address it computes exactly what it computes on the CPU backend, bit for
// bit (the same kernels run). This is what running the StepRunner on a GPU needs.
TEST(StepRunner, OneRankRunsOnMemoryTheHostCannotAddress) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (int micro : {1, 2}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + ", micro-batches " + std::to_string(micro));
      ModelConfig cfg = tiny_gpt();
      cfg.dtype = dt;
      const RunResult ref = run_single(4, micro, cfg);
      OpaqueBackend opaque;
      const RunResult got = run_single(4, micro, cfg, &opaque);
      EXPECT_EQ(got.losses, ref.losses);
      EXPECT_EQ(got.norms, ref.norms);
      EXPECT_EQ(got.eval_loss, ref.eval_loss);
      EXPECT_EQ(got.params, ref.params);
      EXPECT_EQ(got.eval_arena_measured, ref.eval_arena_measured);
    }
  }
}

// Every rank on memory the host cannot address: collectives stage their values through host
// memory (the transport's), ZeRO-1/2 syncs and ZeRO-3 gathers copy through the backend, and
// each rank computes what it computes on the CPU backend, bit for bit (f32 and bf16; data,
// ZeRO-1/2/3, HSDP and tensor parallelism, with gradient accumulation).
TEST(StepRunner, RanksRunOnMemoryTheHostCannotAddress) {
  for (DType dt : {DType::f32, DType::bf16}) {
    ModelConfig cfg = tiny_gpt();
    cfg.dtype = dt;
    for (const Plan& plan : {with_micro(Plan::data_parallel(2, 1), 2), Plan::data_parallel(2, 2),
                             Plan::data_parallel(2, 3), Plan::hybrid_sharded(2, 2),
                             with_searched_layout(Plan::tensor_parallel(2, 2, 1), cfg)}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + plan.describe());
      const int n = plan.mesh.size();
      const std::vector<RunResult> want = run_threads(plan, 3, cfg);
      std::vector<std::unique_ptr<Communicator>> comms = make_local_comms(n);
      std::vector<RunResult> got(static_cast<size_t>(n));
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
          OpaqueBackend opaque;
          got[static_cast<size_t>(r)] =
              run_rank(*comms[static_cast<size_t>(r)], plan, 3, cfg, &opaque);
        });
      for (std::thread& t : threads) t.join();
      for (int r = 0; r < n; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        EXPECT_EQ(got[static_cast<size_t>(r)].losses, want[static_cast<size_t>(r)].losses);
        EXPECT_EQ(got[static_cast<size_t>(r)].params, want[static_cast<size_t>(r)].params);
        EXPECT_EQ(got[static_cast<size_t>(r)].eval_loss, want[static_cast<size_t>(r)].eval_loss);
        EXPECT_EQ(got[static_cast<size_t>(r)].arena_measured,
                  want[static_cast<size_t>(r)].arena_measured);
      }
    }
  }
}

// A device that cannot hold the plan is refused before anything is allocated, naming the
// planned parts; one that holds exactly the plan is enough.
TEST(StepRunner, APlanLargerThanTheDeviceIsAnErrorBeforeAllocating) {
  ModelGraph m = build_model(*find_preset("gpt2-xl"), 4, 1024, ModelMode::train);
  const Plan plan = Plan::data_parallel(1);
  MeshComms comms = MeshComms::single(plan).value();
  NullBackend small(int64_t{16} << 30);  // 16 GiB
  auto made = StepRunner::create(m.graph, plan, small, comms, adamw());
  ASSERT_FALSE(made.ok());
  const std::string msg = made.status().message();
  EXPECT_NE(msg.find("this rank needs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optimizer state"), std::string::npos) << msg;
  EXPECT_NE(msg.find("16.00 GiB free"), std::string::npos) << msg;
  EXPECT_NE(made.status().hint().find("--recompute full"), std::string::npos);
  EXPECT_EQ(small.bytes_in_use(), 0);

  const Program prog = lower(m.graph, plan).value();
  NullBackend exact(prog.persistent_bytes() + prog.memory.arena_bytes);
  auto fits = StepRunner::create(m.graph, plan, exact, comms, adamw());
  ASSERT_TRUE(fits.ok()) << fits.status().to_string();
  EXPECT_EQ(exact.free_memory(), 0);
}

// A loss-only graph is evaluated (add_evaluation), not stepped: create names what it needs.
TEST(StepRunner, LossOnlyGraphIsAnErrorNamingTrainingMode) {
  CpuBackend cpu;
  ModelGraph m = build_model(tiny_gpt(), kBatch, kSeq, ModelMode::loss);
  const Plan plan = Plan::data_parallel(1);
  Result<MeshComms> comms = MeshComms::single(plan);
  ASSERT_TRUE(comms.ok());
  auto made = StepRunner::create(m.graph, plan, cpu, comms.value(), adamw());
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("needs a training graph"), std::string::npos);
  EXPECT_NE(made.status().hint().find("ModelMode::train"), std::string::npos);
}

}  // namespace
}  // namespace tessera
