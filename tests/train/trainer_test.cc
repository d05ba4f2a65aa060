// The training loop on a backend whose memory the host cannot address (OpaqueBackend: a
// stand-in for a GPU): steps, evaluation, checkpoints, an exact resume and the final sample
// go through the Backend interface only, and the run's losses are the CPU backend's, bit for
// bit.
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../cli/train_fixture.h"
#include "../runtime/opaque_backend.h"
#include "comm/local_comm.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class TrainerTest : public TrainDirTest {
 protected:
  std::string trace_;       // --trace of the runs, when set
  int64_t ckpt_every_ = 3;  // --ckpt-every of the runs
  // Trains gpt-tiny (bf16 when `precision` says) on one process; the metrics' losses.
  std::vector<std::string> run(const std::string& out, Backend* backend, int64_t steps,
                               int64_t stop_after, bool resume, const std::string& precision,
                               const Plan& plan = Plan::data_parallel(1),
                               Communicator* world = nullptr,
                               Communicator* device_world = nullptr) {
    TrainOptions o = tiny_options(out);
    o.steps = steps;
    o.warmup = 2;
    o.eval_every = 3;
    o.eval_batches = 2;
    o.ckpt_every = ckpt_every_;
    o.keep_ckpts = 0;  // all of them
    o.log_every = 1;
    o.sample_tokens = 4;
    o.stop_after = stop_after;
    o.resume = resume;
    o.precision = precision;
    o.peak_flops = 1e12;  // no GEMM timing at the start
    o.trace = trace_;
    ModelConfig cfg = *find_preset("gpt-tiny");
    if (precision == "bf16") cfg.dtype = DType::bf16;  // as `train --precision` sets it
    TrainJob job{cfg,     plan,        world, std::string(TESSERA_SOURCE_DIR) + "/data",
                 backend, device_world};
    Status s = train(o, job);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return metric_losses(std::filesystem::path(o.out) / "metrics.jsonl");
  }

  // The same on two ranks (threads over in-process communicators), each on its own backend
  // (`opaque`: an OpaqueBackend, else the CPU's; `device_comms`: with a device world of
  // OpaqueCommunicators, as NCCL is for GPUs); rank 0's metrics.
  std::vector<std::string> run_ranks(const std::string& out, bool opaque, const Plan& plan,
                                     int64_t stop_after, bool resume, bool device_comms = false,
                                     const std::string& precision = "fp32") {
    std::vector<std::unique_ptr<Communicator>> comms = make_local_comms(2);
    std::vector<std::unique_ptr<Communicator>> device_hosts = make_local_comms(2);
    std::vector<std::string> losses;
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        OpaqueBackend device;
        const size_t i = static_cast<size_t>(r);
        OpaqueCommunicator device_world(std::move(device_hosts[i]), device);
        std::vector<std::string> got =
            run(out, opaque ? &device : nullptr, 6, stop_after, resume, precision, plan,
                comms[i].get(), device_comms ? &device_world : nullptr);
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

// The optimizer offloaded to host memory (train --offload optimizer) on memory the host
// cannot address: the same losses as the device optimizer, and checkpoints of the same files —
// a run stopped with offload resumes without it, and the other way round, exactly. One rank
// (fp32, bf16), ZeRO-2 over two and tensor parallelism.
TEST_F(TrainerTest, OffloadedRunsResumeWithOrWithoutOffload) {
  auto offloaded = [](Plan p) {
    p.offload = OffloadPolicy::optimizer;
    return p;
  };
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const Plan one = Plan::data_parallel(1);
    const std::vector<std::string> cpu =
        run("off_cpu_" + precision, nullptr, 6, 0, false, precision);
    OpaqueBackend opaque;
    EXPECT_EQ(run("off_" + precision, &opaque, 6, 0, false, precision, offloaded(one)), cpu);
    run("off_to_on_" + precision, &opaque, 6, 3, false, precision, offloaded(one));
    EXPECT_EQ(run("off_to_on_" + precision, &opaque, 6, 0, true, precision, one), cpu);
    run("on_to_off_" + precision, &opaque, 6, 3, false, precision, one);
    EXPECT_EQ(run("on_to_off_" + precision, &opaque, 6, 0, true, precision, offloaded(one)), cpu);
  }
  for (const Plan& plan : {Plan::data_parallel(2, 2), Plan::tensor_parallel(1, 2)}) {
    SCOPED_TRACE(plan.describe());
    const std::string tag = std::to_string(plan.tensor_group());
    const std::vector<std::string> cpu = run_ranks("off_cpu_ranks" + tag, false, plan, 0, false);
    run_ranks("off_ranks" + tag, true, offloaded(plan), 3, false);
    EXPECT_EQ(run_ranks("off_ranks" + tag, true, plan, 0, true), cpu);
  }
}

// The parameters offloaded too (train --zero 3 --offload params): the same losses as the run
// without offload, and a run stopped with the parameters in host memory resumes without
// offload, and the other way round, exactly. One rank (fp32, bf16) and ZeRO-3 over two, whose
// in-place gathers also run on a device communicator.
TEST_F(TrainerTest, RunsWithParametersInHostMemoryResumeWithOrWithoutOffload) {
  auto params_offloaded = [](Plan p) {
    p.offload = OffloadPolicy::params;
    return p;
  };
  const Plan z3 = Plan::data_parallel(1, 3);
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const std::vector<std::string> cpu =
        run("poff_cpu_" + precision, nullptr, 6, 0, false, precision);
    OpaqueBackend opaque;
    EXPECT_EQ(run("poff_" + precision, &opaque, 6, 0, false, precision, params_offloaded(z3)), cpu);
    run("poff_to_on_" + precision, &opaque, 6, 3, false, precision, params_offloaded(z3));
    EXPECT_EQ(run("poff_to_on_" + precision, &opaque, 6, 0, true, precision, z3), cpu);
  }
  const Plan dp = Plan::data_parallel(2, 3);
  const std::vector<std::string> cpu = run_ranks("poff_cpu_ranks", false, dp, 0, false);
  ASSERT_EQ(cpu.size(), 6u);
  EXPECT_EQ(run_ranks("poff_device_ranks", true, params_offloaded(dp), 0, false, true), cpu);
  run_ranks("poff_ranks", true, params_offloaded(dp), 3, false);
  EXPECT_EQ(run_ranks("poff_ranks", true, dp, 0, true), cpu);
  run_ranks("on_to_poff_ranks", true, dp, 3, false);
  EXPECT_EQ(run_ranks("on_to_poff_ranks", true, params_offloaded(dp), 0, true), cpu);
}

// The same with a device communicator (OpaqueCommunicator, as NCCL on GPUs): the step's
// collectives take the values where they lie, in their dtype (no host staging); data
// parallelism with ZeRO-1 and ZeRO-3, tensor parallelism, and bf16 under ZeRO-1, through a
// resume, with the CPU ranks' losses bit for bit.
TEST_F(TrainerTest, RanksWithADeviceCommunicatorFollowTheCpuRanks) {
  const std::vector<std::pair<Plan, std::string>> cases = {{Plan::data_parallel(2, 1), "fp32"},
                                                           {Plan::data_parallel(2, 3), "fp32"},
                                                           {Plan::tensor_parallel(1, 2), "fp32"},
                                                           {Plan::data_parallel(2, 1), "bf16"}};
  for (const auto& [plan, precision] : cases) {
    SCOPED_TRACE(plan.describe() + " " + precision);
    const std::string tag =
        std::to_string(plan.tensor_group()) + "z" + std::to_string(plan.zero) + precision;
    const std::vector<std::string> cpu =
        run_ranks("cpu_ranks" + tag, false, plan, 0, false, false, precision);
    ASSERT_EQ(cpu.size(), 6u);
    EXPECT_EQ(run_ranks("device_ranks" + tag, true, plan, 0, false, true, precision), cpu);
    run_ranks("device_resumed" + tag, true, plan, 3, false, true, precision);
    EXPECT_EQ(run_ranks("device_resumed" + tag, true, plan, 0, true, true, precision), cpu);
  }
}

// Checkpoints are written during the next step (from a host snapshot) and published after
// it: a run resumed from one of them (step 2's, written while step 3 trained) continues with
// the uninterrupted run's losses bit for bit, so the files hold step 2's state, not what step 3
// did to it. One process (plain files) and two ranks (shards, published by rank 0).
TEST_F(TrainerTest, CheckpointsWrittenDuringTheNextStepResumeExactly) {
  ckpt_every_ = 2;
  for (int ranks : {1, 2}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const std::string out = "async" + std::to_string(ranks);
    auto go = [&](bool resume) {
      return ranks == 1 ? run(out, nullptr, 6, 0, resume, "fp32")
                        : run_ranks(out, false, Plan::data_parallel(2, 1), 0, resume);
    };
    const std::vector<std::string> straight = go(false);
    ASSERT_EQ(straight.size(), 6u);
    const fs::path ckpts = dir_ / out / "checkpoints";
    for (const char* step : {"step-00000002", "step-00000004", "step-00000006"})
      ASSERT_TRUE(fs::exists(ckpts / step / "manifest.json")) << step;
    fs::remove_all(ckpts / "step-00000004");
    fs::remove_all(ckpts / "step-00000006");
    std::ofstream(ckpts / "latest") << "step-00000002\n";
    EXPECT_EQ(go(true), straight);
  }
}

// --trace on two data-parallel ranks: one file, a process per rank, each with its compute
// track and the comm track of its data-parallel group, whose gradient collectives start while
// the backward pass still computes (the overlap is measured, not assumed).
TEST_F(TrainerTest, TraceShowsEachRanksComputeAndCollectivesOverlapping) {
  trace_ = (dir_ / "step.json").string();
  Plan plan = Plan::data_parallel(2, 2);
  plan.bucket_bytes = 64 << 10;  // several gradient buckets per step
  ASSERT_EQ(run_ranks("traced", false, plan, 0, false).size(), 6u);
  std::ifstream f(trace_);
  ASSERT_TRUE(f.good());
  const nlohmann::json doc = nlohmann::json::parse(f);
  std::map<int, std::map<int, std::string>> tracks;  // pid -> tid -> name
  std::map<int, double> last_compute_end, first_comm_start;
  int compute_spans = 0, comm_spans = 0;
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      tracks[e.at("pid").get<int>()][e.at("tid").get<int>()] = e.at("args").at("name");
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const int pid = e.at("pid").get<int>();
    const std::string& track = tracks[pid][e.at("tid").get<int>()];
    const double ts = e.at("ts").get<double>(), end = ts + e.at("dur").get<double>();
    if (track == "compute") {
      ++compute_spans;
      last_compute_end[pid] = std::max(last_compute_end[pid], end);
    } else {
      EXPECT_EQ(track.rfind("comm ", 0), 0u) << track;
      ++comm_spans;
      if (!first_comm_start.count(pid) || ts < first_comm_start[pid]) first_comm_start[pid] = ts;
    }
  }
  ASSERT_EQ(tracks.size(), 2u);
  for (int pid : {0, 1}) {
    bool dp = false;
    for (const auto& [tid, name] : tracks[pid]) dp = dp || name == "comm dp";
    EXPECT_TRUE(dp) << "rank " << pid << " has no dp comm track";
    ASSERT_TRUE(first_comm_start.count(pid));
    EXPECT_LT(first_comm_start[pid], last_compute_end[pid])
        << "rank " << pid << ": no collective started before the compute ended";
  }
  EXPECT_GT(compute_spans, 50);
  EXPECT_GT(comm_spans, 4);
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
