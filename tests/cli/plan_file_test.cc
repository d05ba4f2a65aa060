// `--plan FILE` in a framework's words: simulate predicts what the same plan given as flags
// predicts (Megatron-Core, DeepSpeed and torchtitan spellings); the precision it gives is taken
// or checked; plan and train read it too.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "train_fixture.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class PlanFile : public TrainDirTest {
 protected:
  std::string write(const std::string& name, const std::string& json) {
    std::ofstream(dir_ / name) << json;
    return (dir_ / name).string();
  }
  nlohmann::json simulate(const std::string& args) {
    std::string out;
    EXPECT_EQ(run_command(std::string(TESSERA_BINARY) + " simulate " + args + " --json", &out), 0)
        << args << "\n"
        << out;
    return nlohmann::json::parse(out, nullptr, false);
  }
  // The same prediction: step time, memory and the plan.
  void expect_same(const nlohmann::json& a, const nlohmann::json& b) {
    ASSERT_TRUE(a.is_object() && b.is_object());
    EXPECT_EQ(a["plan"], b["plan"]);
    EXPECT_DOUBLE_EQ(a["step_s"].get<double>(), b["step_s"].get<double>());
    EXPECT_DOUBLE_EQ(a["peak_bytes_per_device"].get<double>(),
                     b["peak_bytes_per_device"].get<double>());
    EXPECT_EQ(a["precision"], b["precision"]);
  }
};

TEST_F(PlanFile, SimulateReadsFrameworkPlansAsTheirFlags) {
  const std::string model = "llama2-7b --cluster dgx-a100 --gpus 64 --batch 64 --seq 2048";
  // Megatron-Core: tp 8, the distributed optimizer, selective recomputation, sp, bf16.
  const std::string megatron =
      write("megatron.json",
            R"({"tensor_model_parallel_size": 8, "use_distributed_optimizer": true,
                "recompute_granularity": "selective", "sequence_parallel": true,
                "bf16": true, "num_microbatches": 2})");
  expect_same(simulate(model + " --plan " + megatron),
              simulate(model + " --tp 8 --zero 1 --recompute selective --sequence-parallel "
                               "--grad-accum 2 --precision bf16"));
  // DeepSpeed: ZeRO-3 with the optimizer offloaded, full activation checkpointing.
  const std::string deepspeed = write(
      "ds.json", R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
                     "bf16": {"enabled": true}, "activation_checkpointing": true})");
  const std::string h100 = "llama2-7b --cluster dgx-h100 --gpus 8 --batch 8 --seq 2048";
  expect_same(simulate(h100 + " --plan " + deepspeed),
              simulate(h100 + " --zero 3 --offload optimizer --recompute full"));
  // ZeRO-Infinity: the parameters offloaded beside the optimizer.
  const std::string infinity = write("infinity.json", R"({"zero_optimization": {"stage": 3,
                                    "offload_optimizer": {"device": "cpu"},
                                    "offload_param": {"device": "cpu"}},
                                 "bf16": {"enabled": true}})");
  expect_same(simulate(h100 + " --plan " + infinity),
              simulate(h100 + " --zero 3 --offload params"));
  // torchtitan: HSDP (shard groups of 8, 2 replicas) x tp 2 on 32 GPUs, FP8 GEMMs.
  const std::string titan = write("titan.json", R"({"parallelism": {"data_parallel_shard_degree": 8,
                                              "data_parallel_replicate_degree": 2,
                                              "tensor_parallel_degree": 2},
                              "float8": "rowwise", "mixed_precision_param": "bfloat16"})");
  const std::string h32 = "llama2-7b --cluster dgx-h100 --gpus 32 --batch 32 --seq 2048";
  const nlohmann::json t = simulate(h32 + " --plan " + titan);
  expect_same(t, simulate(h32 + " --tp 2 --hsdp 2 --precision fp8"));
  EXPECT_EQ(t["precision"], "fp8");
}

TEST_F(PlanFile, ErrorsNameTheKeyAndTheFix) {
  std::string out;
  const std::string typo = write("typo.json", R"({"parallelism": {"tensor_paralel_degree": 2}})");
  EXPECT_EQ(run_command(
                std::string(TESSERA_BINARY) + " simulate gpt2-small --gpus 8 --plan " + typo, &out),
            1)
      << out;
  EXPECT_NE(out.find("error: " + typo + ": plan: unknown key 'parallelism.tensor_paralel_degree'"),
            std::string::npos)
      << out;
  // The precision: --precision must agree with the file; train's must be the file's.
  const std::string bf16 = write("bf16.json", R"({"tp": 2, "bf16": true})");
  EXPECT_EQ(run_command(std::string(TESSERA_BINARY) + " simulate gpt2-small --gpus 8 --plan " +
                            bf16 + " --precision f16",
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("error: --precision f16, but the plan file says bf16"), std::string::npos)
      << out;
  EXPECT_EQ(run_command(std::string(TESSERA_BINARY) + " train --model gpt-tiny --data " +
                            (dir_ / "data").string() + " --out " + (dir_ / "run").string() +
                            " --seq 16 --steps 1 --plan " + bf16,
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("error: the plan file says bf16 and the run is f32"), std::string::npos)
      << out;
  EXPECT_NE(out.find("train with --precision bf16"), std::string::npos) << out;
  // Parameters offloaded without their optimizer state: not a plan Tessera runs.
  const std::string params_only = write(
      "po.json", R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})");
  EXPECT_EQ(run_command(
                std::string(TESSERA_BINARY) + " simulate gpt2-small --gpus 8 --plan " + params_only,
                &out),
            1)
      << out;
  EXPECT_NE(out.find("offloads the parameters but not the optimizer"), std::string::npos) << out;
  // The file's knobs and the command's flags: the same value or an error naming both.
  const std::string megatron = write("m.json", R"({"tensor_model_parallel_size": 8})");
  EXPECT_EQ(run_command(std::string(TESSERA_BINARY) + " simulate llama2-7b --gpus 16 --plan " +
                            megatron + " --tp 4",
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("error: " + megatron + ": --tp 4, but the plan file gives 8"),
            std::string::npos)
      << out;
  // A pipeline that names no sharding is ZeRO-0, as Megatron reads it (simulate's ZeRO-3 default
  // does not apply), and a later error names the flags the file was read as.
  const std::string pipe = write("pipe.json", R"({"pipeline_model_parallel_size": 4})");
  const nlohmann::json piped = simulate(
      "llama2-7b --cluster dgx-a100 --gpus 16 --batch 16 "
      "--grad-accum 4 --seq 2048 --plan " +
      pipe);
  EXPECT_EQ(piped["plan"]["zero"], 0);
  EXPECT_EQ(run_command(std::string(TESSERA_BINARY) + " simulate llama2-7b --gpus 6 --plan " + pipe,
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("(read as --pp 4 --zero 0)"), std::string::npos) << out;
  // train runs the micro-batches --grad-accum says: the file's must be those (launch's check
  // says so once); with them, it trains.
  const std::string accum = write("accum.json", R"({"dp": 2, "gradient_accumulation_steps": 2})");
  const std::string train = std::string(TESSERA_BINARY) + " launch -n 2 -- train --model " +
                            "gpt-tiny --data " + (dir_ / "data").string() +
                            " --seq 16 --batch 4 --steps 2 --sample-tokens 0 --eval-every 0 "
                            "--plan " +
                            accum;
  EXPECT_EQ(run_command(train + " --out " + (dir_ / "a1").string(), &out), 1) << out;
  EXPECT_NE(out.find("--grad-accum 1, but the plan file gives 2"), std::string::npos) << out;
  EXPECT_EQ(
      run_command("OMP_NUM_THREADS=1 " + train + " --grad-accum 2 --out " + (dir_ / "a2").string(),
                  &out),
      0)
      << out;
  EXPECT_NE(out.find("dp=2 zero=0 micro_batches=2"), std::string::npos) << out;
  EXPECT_EQ(metric_losses(dir_ / "a2/metrics.jsonl").size(), 2u);
  // No data degree and no device count.
  const std::string tp = write("tp.json", R"({"tp": 2})");
  EXPECT_EQ(run_command(std::string(TESSERA_BINARY) + " plan gpt-tiny --plan " + tp, &out), 1)
      << out;
  EXPECT_NE(out.find("the file gives no data-parallel degree"), std::string::npos) << out;
  // With one, `plan` lowers it: tp 2 x dp 2 with ZeRO-1.
  const std::string four = write("four.json", R"({"tp": 2, "dp": 2, "zero_stage": 1})");
  out.clear();
  EXPECT_EQ(
      run_command(std::string(TESSERA_BINARY) + " plan gpt-tiny --batch 4 --plan " + four, &out), 0)
      << out;
  EXPECT_NE(out.find("plan            dp=2 x tp=2 zero=1"), std::string::npos) << out;
  // A file whose plan is one rank trains in this process (ZeRO-Infinity on one device: ZeRO-3
  // with the optimizer and the parameters in host memory); one of two ranks needs launch.
  const std::string infinity = write("one.json", R"({"dp": 1, "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})");
  const std::string one = std::string(TESSERA_BINARY) + " train --model gpt-tiny --data " +
                          (dir_ / "data").string() +
                          " --seq 16 --batch 2 --steps 2 --sample-tokens 0 --eval-every 0 --plan ";
  out.clear();
  EXPECT_EQ(run_command(one + infinity + " --out " + (dir_ / "one").string(), &out), 0) << out;
  EXPECT_NE(out.find("parameters 0 B (gathered from host memory per use)"), std::string::npos)
      << out;
  EXPECT_EQ(metric_losses(dir_ / "one/metrics.jsonl").size(), 2u);
  out.clear();
  EXPECT_EQ(run_command(one + accum + " --grad-accum 2 --out " + (dir_ / "two").string(), &out), 1)
      << out;
  EXPECT_NE(out.find("a distributed plan needs one process per rank"), std::string::npos) << out;
  EXPECT_NE(out.find("tessera launch -n 2 -- train"), std::string::npos) << out;
  // A one-rank file that is wrong says what is wrong with it, not that it needs launch.
  const std::string stage1 = write("stage1.json", R"({"dp": 1, "zero_optimization": {"stage": 1,
      "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})");
  out.clear();
  EXPECT_EQ(run_command(one + stage1 + " --out " + (dir_ / "stage1").string(), &out), 1) << out;
  EXPECT_NE(out.find("offloading the parameters needs ZeRO-3 (zero = 1)"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("one process per rank"), std::string::npos) << out;
}

}  // namespace
}  // namespace tessera
