// The optimizer offloaded to host memory (Plan::offload): on a backend whose memory the host
// cannot address, every rank's losses and parameters are the device optimizer's, bit for bit,
// and the device holds only what Program::persistent_bytes() says.
#include <thread>

#include "backend/null_backend.h"
#include "comm/local_comm.h"
#include "equivalence.h"
#include "opaque_backend.h"

namespace tessera {
namespace {

using namespace testing_equivalence;

Plan offloaded(Plan p) {
  p.offload = OffloadPolicy::optimizer;
  return p;
}

// ZeRO-3 with the parameter blocks in host memory too (ZeRO-Infinity's form).
Plan params_offloaded(Plan p) {
  p.offload = OffloadPolicy::params;
  return p;
}

Plan with_micro(Plan p, int k) {
  p.micro_batches = k;
  return p;
}

// Each rank of `plan` on an opaque backend of its own, as threads.
std::vector<RunResult> run_opaque(const Plan& plan, int steps, const ModelConfig& cfg) {
  const int n = plan.mesh.size();
  std::vector<std::unique_ptr<Communicator>> comms = make_local_comms(n);
  std::vector<RunResult> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      OpaqueBackend opaque;
      out[static_cast<size_t>(r)] =
          run_rank(*comms[static_cast<size_t>(r)], plan, steps, cfg, &opaque);
    });
  for (std::thread& t : threads) t.join();
  return out;
}

// The host's AdamW runs the CPU backend's kernel on the same f32 values (gradients widened
// exactly, the norm summed in the same fixed chunks), so offloading changes no bit: f32 and
// bf16; one rank with and without gradient accumulation, ZeRO-1/2 (syncs of the f32 master
// blocks in host memory), ZeRO-3 and tensor parallelism.
TEST(Offload, MatchesTheDeviceOptimizerBitForBit) {
  for (DType dt : {DType::f32, DType::bf16}) {
    ModelConfig cfg = tiny_gpt();
    cfg.dtype = dt;
    for (const Plan& plan :
         {Plan::data_parallel(1), with_micro(Plan::data_parallel(1), 2), Plan::data_parallel(2, 1),
          Plan::data_parallel(2, 2), Plan::data_parallel(2, 3),
          with_searched_layout(Plan::tensor_parallel(1, 2), cfg)}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + plan.describe());
      const std::vector<RunResult> want = run_opaque(plan, 3, cfg);
      const std::vector<RunResult> got = run_opaque(offloaded(plan), 3, cfg);
      for (size_t r = 0; r < want.size(); ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        EXPECT_EQ(got[r].losses, want[r].losses);
        EXPECT_EQ(got[r].params, want[r].params);
        EXPECT_EQ(got[r].eval_loss, want[r].eval_loss);
        EXPECT_LT(got[r].persistent_bytes, want[r].persistent_bytes);
      }
    }
  }
}

// Parameters offloaded too: every ZeRO-3 gather is fed by a copy of the host-held block into
// its slot of the gathered tensor, and AdamW writes the blocks in host memory, so the run is
// the ZeRO-3 run's bit for bit (f32, bf16, and f16 with its loss scale): one rank (ZeRO-3 over a
// group of one: without offload no gathers at all), two ranks with and without gradient
// accumulation, HSDP, and ZeRO-3 beside tensor parallelism. The gathers write only what the arena
// plans.
TEST(Offload, ParametersInHostMemoryMatchTheDeviceParametersBitForBit) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    ModelConfig cfg = tiny_gpt();
    cfg.dtype = dt;
    for (const Plan& plan : {Plan::data_parallel(1, 3), Plan::data_parallel(2, 3),
                             with_micro(Plan::data_parallel(2, 3), 2), Plan::hybrid_sharded(2, 2),
                             with_searched_layout(Plan::tensor_parallel(2, 2, 3), cfg)}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + plan.describe());
      const std::vector<RunResult> want = run_opaque(plan, 3, cfg);
      const std::vector<RunResult> got = run_opaque(params_offloaded(plan), 3, cfg);
      const std::vector<RunResult> optimizer_only = run_opaque(offloaded(plan), 1, cfg);
      for (size_t r = 0; r < want.size(); ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        ASSERT_EQ(got[r].losses.size(), 3u);
        EXPECT_EQ(got[r].losses, want[r].losses);
        EXPECT_EQ(got[r].params, want[r].params);
        EXPECT_EQ(got[r].eval_loss, want[r].eval_loss);
        EXPECT_LT(got[r].persistent_bytes, optimizer_only[r].persistent_bytes);
        EXPECT_LE(got[r].arena_measured, got[r].arena_planned);
      }
    }
  }
}

// Offloaded parameters: the device holds no parameter between steps (a device of exactly the
// plan's bytes is enough), the host holds the blocks beside the optimizer's state (bf16: their
// own copy; f32: the masters are the blocks), and the Program fetches each block before the
// gather that reads it, over the link.
TEST(Offload, TheDeviceHoldsNoParametersBetweenSteps) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    ModelConfig cfg = tiny_gpt();
    cfg.dtype = dt;
    ModelGraph m = build_model(cfg, kBatch, kSeq, ModelMode::train);
    const Plan plan = params_offloaded(with_micro(Plan::data_parallel(1, 3), 2));
    MeshComms comms = MeshComms::single(plan).value();
    const Program off = lower(m.graph, plan).value();
    const Program opt = lower(m.graph, offloaded(with_micro(Plan::data_parallel(1, 3), 2))).value();
    EXPECT_EQ(off.param_bytes, 0);
    EXPECT_EQ(off.optim_bytes, 0);
    EXPECT_EQ(off.host_bytes - opt.host_bytes, dt == DType::f32 ? 0 : opt.param_bytes);
    int fetches = 0, gathers = 0;
    for (size_t k = 0; k < off.micro_step.size(); ++k) {
      const Instruction& in = off.micro_step[k];
      if (in.kind == Instruction::param_fetch) {
        ++fetches;
        EXPECT_EQ(in.stream, Stream::link);
        ASSERT_LT(k + 1, off.micro_step.size());
        EXPECT_EQ(off.micro_step[k + 1].kind, Instruction::start);
        EXPECT_EQ(off.micro_step[k + 1].node, in.node);
      }
      if (in.kind == Instruction::start && off.local().node(in.node).op == OpKind::all_gather)
        ++gathers;
    }
    EXPECT_EQ(fetches, gathers);
    // Each parameter in the forward pass, the matmuls' weights again in the backward.
    EXPECT_GT(fetches, static_cast<int>(off.part.params.size()));
    for (const Instruction& in : off.optimizer) EXPECT_NE(in.kind, Instruction::param_to_device);
    NullBackend exact(off.persistent_bytes() + off.memory.arena_bytes);
    auto made = StepRunner::create(m.graph, plan, exact, comms, adamw());
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    EXPECT_EQ(exact.free_memory(), 0);
    EXPECT_EQ((*made)->state_bytes_allocated(), off.persistent_bytes());
    EXPECT_EQ((*made)->host_state_bytes_allocated(), off.host_bytes);
  }
}

// The device gets the parameters and accumulators alone (a device of exactly the plan's bytes
// is enough); the host holds what Program::host_bytes says; the device optimizer's state is
// the difference (AdamW's moments, and the f32 masters of a bf16 graph).
TEST(Offload, TheDeviceHoldsNoOptimizerState) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    ModelConfig cfg = tiny_gpt();
    cfg.dtype = dt;
    ModelGraph m = build_model(cfg, kBatch, kSeq, ModelMode::train);
    const Plan plan = offloaded(with_micro(Plan::data_parallel(1), 2));
    MeshComms comms = MeshComms::single(plan).value();
    const Program off = lower(m.graph, plan).value();
    const Program on = lower(m.graph, with_micro(Plan::data_parallel(1), 2)).value();
    EXPECT_EQ(off.optim_bytes, 0);
    EXPECT_EQ(on.persistent_bytes() - off.persistent_bytes(), on.optim_bytes);
    NullBackend exact(off.persistent_bytes() + off.memory.arena_bytes);
    auto made = StepRunner::create(m.graph, plan, exact, comms, adamw());
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    EXPECT_EQ(exact.free_memory(), 0);
    EXPECT_EQ((*made)->state_bytes_allocated(), off.persistent_bytes());
    EXPECT_EQ((*made)->host_state_bytes_allocated(), off.host_bytes);
    EXPECT_EQ(&(*made)->state_backend() == &exact, false);
  }
}

}  // namespace
}  // namespace tessera
