// The training loop on a backend whose memory the host cannot address (OpaqueBackend: a
// stand-in for a GPU): steps, evaluation, checkpoints, an exact resume and the final sample
// go through the Backend interface only, and the run's losses are the CPU backend's, bit for
// bit.
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../cli/train_fixture.h"
#include "../runtime/opaque_backend.h"
#include "comm/local_comm.h"

namespace tessera {
namespace {

class TrainerTest : public TrainDirTest {
 protected:
  // Trains gpt-tiny (bf16 when `precision` says) on one process; the metrics' losses.
  std::vector<std::string> run(const std::string& out, Backend* backend, int64_t steps,
                               int64_t stop_after, bool resume, const std::string& precision,
                               const Plan& plan = Plan::data_parallel(1),
                               Communicator* world = nullptr) {
    TrainOptions o = tiny_options(out);
    o.steps = steps;
    o.warmup = 2;
    o.eval_every = 3;
    o.eval_batches = 2;
    o.ckpt_every = 3;
    o.log_every = 1;
    o.sample_tokens = 4;
    o.stop_after = stop_after;
    o.resume = resume;
    o.precision = precision;
    o.peak_flops = 1e12;  // no GEMM timing at the start
    ModelConfig cfg = *find_preset("gpt-tiny");
    if (precision == "bf16") cfg.dtype = DType::bf16;  // as `train --precision` sets it
    TrainJob job{cfg, plan, world, std::string(TESSERA_SOURCE_DIR) + "/data", backend};
    Status s = train(o, job);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return metric_losses(std::filesystem::path(o.out) / "metrics.jsonl");
  }

  // The same on two ranks (threads over in-process communicators), each on its own backend
  // (`opaque`: an OpaqueBackend, else the CPU's); rank 0's metrics.
  std::vector<std::string> run_ranks(const std::string& out, bool opaque, const Plan& plan,
                                     int64_t stop_after, bool resume) {
    std::vector<std::unique_ptr<Communicator>> comms = make_local_comms(2);
    std::vector<std::string> losses;
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        OpaqueBackend device;
        std::vector<std::string> got = run(out, opaque ? &device : nullptr, 6, stop_after, resume,
                                           "fp32", plan, comms[static_cast<size_t>(r)].get());
        if (r == 0) losses = got;
      });
    for (std::thread& t : ranks) t.join();
    return losses;
  }
};

TEST_F(TrainerTest, TrainsEvaluatesCheckpointsAndResumesOnMemoryTheHostCannotAddress) {
  std::vector<std::string> fp32;
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const std::vector<std::string> cpu = run("cpu_" + precision, nullptr, 6, 0, false, precision);
    ASSERT_EQ(cpu.size(), 6u);
    if (precision == "fp32")
      fp32 = cpu;
    else
      EXPECT_NE(cpu, fp32) << "the bf16 run trains in bf16";
    OpaqueBackend opaque;
    EXPECT_EQ(run("opaque_" + precision, &opaque, 6, 0, false, precision), cpu);
    // Stopped after 3 steps (a checkpoint), resumed from it: the same 6 losses.
    run("resumed_" + precision, &opaque, 6, 3, false, precision);
    EXPECT_EQ(run("resumed_" + precision, &opaque, 6, 0, true, precision), cpu);
  }
}

// Two ranks, each on memory the host cannot address (as two GPUs, or two ranks sharing one,
// under `launch -n 2 -- train --device cuda`): data parallelism with ZeRO-1 (the parameter
// syncs) and tensor parallelism train, evaluate, save sharded checkpoints and resume with the
// CPU ranks' losses, bit for bit.
TEST_F(TrainerTest, RanksTrainCheckpointAndResumeOnMemoryTheHostCannotAddress) {
  for (const Plan& plan : {Plan::data_parallel(2, 1), Plan::tensor_parallel(1, 2)}) {
    SCOPED_TRACE(plan.describe());
    const std::string tag = std::to_string(plan.tensor_group());
    const std::vector<std::string> cpu = run_ranks("cpu_ranks" + tag, false, plan, 0, false);
    ASSERT_EQ(cpu.size(), 6u);
    EXPECT_EQ(run_ranks("opaque_ranks" + tag, true, plan, 0, false), cpu);
    run_ranks("resumed_ranks" + tag, true, plan, 3, false);
    EXPECT_EQ(run_ranks("resumed_ranks" + tag, true, plan, 0, true), cpu);
  }
}

// bf16 on a device with gpt-tiny's 50,257 token rows: the run says which padded size keeps the
// LM head's GEMMs aligned; fp32 on a device, and bf16 on the CPU, say nothing.
TEST_F(TrainerTest, AnUnalignedVocabularyInBf16OnADeviceGetsANote) {
  const std::string note = "padded_vocab_size = 50304 in a model config";
  auto printed = [&](const std::string& out, Backend* backend, const std::string& precision) {
    ::testing::internal::CaptureStderr();
    run(out, backend, 1, 0, false, precision);
    return ::testing::internal::GetCapturedStderr();
  };
  OpaqueBackend opaque;
  EXPECT_NE(printed("bf16_device", &opaque, "bf16").find(note), std::string::npos);
  EXPECT_EQ(printed("fp32_device", &opaque, "fp32").find(note), std::string::npos);
  EXPECT_EQ(printed("bf16_cpu", nullptr, "bf16").find(note), std::string::npos);
}

}  // namespace
}  // namespace tessera
