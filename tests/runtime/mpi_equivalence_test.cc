// The equivalence tests over MPI, one process per rank (CTest label `mpi`):
//   mpirun -np 4 mpi_equivalence_test zero3
// trains the tiny GPT (the tiny LLaMA for the tensor-parallel plans tp and tp_zero3: tp 2,
// the other ranks data-parallel; GPT on the searched layout for gpt_tp3 and gpt_tp_zero1) for 10
// steps under the named plan and compares every rank's losses and final parameters with a 1-rank
// run on the same global batches (computed on each rank), and checks planned = measured arena and
// analytic = measured bytes sent. Pipeline plans (pp: GPT over n stages; pp_3d: LLaMA over
// pp 2 x dp 2 x tp 2) compare each stage's parameters and its planned = measured memory.
#include <cstring>

#include "../mpi_test_main.h"
#include "pipeline_equivalence.h"

namespace tessera {
namespace {

using namespace testing_equivalence;

Communicator* g_world = nullptr;
Plan g_plan;
ModelConfig g_model = tiny_gpt();

TEST(MpiEquivalence, MatchesOneRank) {
  ASSERT_NE(g_world, nullptr);
  const int steps = 10;
  RunResult ref = run_single(steps, g_plan.micro_batches, g_model);
  if (g_plan.stages() > 1) {  // each stage checks its own parameters
    PipeResult got = run_pipeline_rank(*g_world, g_plan, steps, g_model);
    expect_pipeline_equivalent(ref, got, g_model);
    if (g_world->rank() == 0)
      std::printf("%s: loss %.6f -> %.6f (1 rank %.6f), stage 0 arena + stash %ld B\n",
                  g_plan.describe().c_str(), got.losses.front(), got.losses.back(),
                  ref.losses.back(), static_cast<long>(got.arena_measured));
    return;
  }
  RunResult got = run_rank(*g_world, g_plan, steps, g_model);
  expect_equivalent(ref, got);
  EXPECT_EQ(got.arena_measured, got.arena_planned);
  EXPECT_NEAR(got.comm_bytes_measured, got.comm_bytes_planned, 0.002 * got.comm_bytes_planned + 64);
  if (g_world->rank() == 0)
    std::printf(
        "%s: loss %.6f -> %.6f (1 rank %.6f), %.0f bytes sent per step (planned %.0f), "
        "arena %ld B, persistent %ld B per rank\n",
        g_plan.describe().c_str(), got.losses.front(), got.losses.back(), ref.losses.back(),
        got.comm_bytes_measured, got.comm_bytes_planned, static_cast<long>(got.arena_planned),
        static_cast<long>(got.persistent_bytes));
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::run_mpi_tests(
      argc, argv, &tessera::g_world, [](tessera::Communicator& world, int argc, char** argv) {
        using tessera::Plan;
        const int n = world.size();
        const std::string which = argc > 1 ? argv[1] : "dp";
        if (which == "dp")
          tessera::g_plan = Plan::data_parallel(n, 0);
        else if (which == "zero1")
          tessera::g_plan = Plan::data_parallel(n, 1);
        else if (which == "zero2")
          tessera::g_plan = Plan::data_parallel(n, 2);
        else if (which == "zero3")
          tessera::g_plan = Plan::data_parallel(n, 3);
        else if (which == "hsdp")
          tessera::g_plan = Plan::hybrid_sharded(2, n / 2);
        else if (which == "tp" || which == "tp_zero3") {
          using namespace tessera::testing_equivalence;
          tessera::g_model = tiny_llama();
          tessera::g_plan = with_megatron_llama(
              Plan::tensor_parallel(n / 2, 2, which == "tp" ? 0 : 3), tiny_llama());
        } else if (which == "gpt_tp3" || which == "gpt_tp_zero1") {
          // GPT on the layout the search finds: tp 3 on 3 ranks (6 heads), or tp 2 x dp 2.
          using namespace tessera::testing_equivalence;
          tessera::ModelConfig c = tiny_gpt();
          if (which == "gpt_tp3") c.n_embd = 48, c.n_head = 6;
          tessera::g_model = c;
          const int tp = which == "gpt_tp3" ? 3 : 2;
          tessera::g_plan = with_searched_layout(
              Plan::tensor_parallel(n / tp, tp, which == "gpt_tp3" ? 0 : 1), c);
        } else if (which == "pp" || which == "pp_3d") {
          // GPT (tied wte on the first and last stage) over n stages, 1F1B; or 3-D: LLaMA over
          // pp 2 x dp 2 x tp 2, ZeRO-1.
          using namespace tessera::testing_equivalence;
          const bool three_d = which == "pp_3d";
          tessera::ModelConfig c = three_d ? tiny_llama() : tiny_gpt();
          c.n_layer = three_d ? 2 : 4;
          tessera::g_model = c;
          Plan p = three_d ? Plan::pipeline_parallel(2, n / 4, 2, 1)
                           : Plan::pipeline_parallel(n, 1, 1, 0);
          p.schedule = tessera::ScheduleKind::one_f_one_b;
          p.micro_batches = 4;
          tessera::g_plan = three_d ? with_megatron_llama(p, c) : p;
        } else {
          std::fprintf(stderr,
                       "unknown plan '%s' (dp, zero1, zero2, zero3, hsdp, tp, tp_zero3, gpt_tp3, "
                       "gpt_tp_zero1, pp, pp_3d)\n",
                       which.c_str());
          return 2;
        }
        return 0;
      });
}
