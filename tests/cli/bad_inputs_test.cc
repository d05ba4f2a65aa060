// Bad inputs from the review (../shared/reviews/bad-inputs-cd173a2.md) that each get one
// `error:` paragraph naming the thing, before any work: config paths that are not TOML,
// a --data that is a file, shards tokenize would overwrite, launch's command and run directory
// checked once,
// calibrate's --out a directory, CSV tables with a byte-order mark, no rows or no GPUs; and a
// topology the simulator does not model is said to be timed as a fat tree.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "train_fixture.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class BadInputs : public TrainDirTest {
 protected:
  // Runs tessera with `args`; expects exit `rc` and every one of `texts` in the output.
  void expect(const std::string& args, int rc, std::initializer_list<const char*> texts) {
    std::string out;
    EXPECT_EQ(run_command("cd " + dir_.string() + " && " + TESSERA_BINARY + " " + args, &out), rc)
        << args << "\n"
        << out;
    for (const char* t : texts) EXPECT_NE(out.find(t), std::string::npos) << args << "\n" << out;
    EXPECT_EQ(out.find("internal error"), std::string::npos) << out;
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
};

TEST_F(BadInputs, ModelPathsThatAreNotTomlConfigsAreNamed) {
  write("model.conf", "[model]\npreset = \"gpt-tiny\"\n");
  write("MODEL.TOML", "[model]\npreset = \"gpt-tiny\"\n");
  write("manifest.json", "{}");
  fs::create_directories(dir_ / "cfgdir");
  expect("graph model.conf", 1, {"is a file, but model configs are TOML", "end in .toml"});
  expect("graph manifest.json", 1, {"--init-from"});
  expect("graph cfgdir", 1, {"'cfgdir' is a directory"});
  expect("graph MODEL.TOML --seq 16", 0, {"gpt-tiny"});  // the extension in any case
}

// A --plan naming a directory is one error for every command that reads plans (it aborted
// with an uncaught std::__ios_failure: bad-inputs-7d08d5e N3), also in one process of train
// (which said a distributed plan needs ranks) and under launch (checked once, before ranks).
TEST_F(BadInputs, APlanThatIsADirectoryIsNamed) {
  fs::create_directories(dir_ / "plans");
  const char* said = "plan: cannot read 'plans': Is a directory";
  expect("plan gpt-tiny --plan plans --seq 16", 1, {said, "pass a plan file"});
  expect("simulate gpt-tiny --plan plans --seq 16", 1, {said});
  const std::string run = "train --model gpt-tiny --seq 16 --steps 1 --data data --out run ";
  expect(run + "--plan plans", 1, {said});
  expect("launch -n 2 -- " + run + "--plan plans", 1, {said});
}

// --peak-flops in the wrong unit (1 meant as TFLOP/s) is refused, not reported as an MFU of
// billions of percent (N17); help texts say what the commands do now (N18).
TEST_F(BadInputs, PeakFlopsInTheWrongUnitAndStaleHelp) {
  expect("train --model gpt-tiny --seq 16 --steps 1 --data data --out run --peak-flops 1", 1,
         {"--peak-flops 1 FLOP/s is below any device's peak", "9.89e14"});
  std::string out;
  ASSERT_EQ(run_command(std::string(TESSERA_BINARY) + " train --help", &out), 0);
  EXPECT_EQ(out.find("not with --pp"), std::string::npos) << out;  // fp16 pipelines train
  ASSERT_EQ(run_command(std::string(TESSERA_BINARY) + " --help", &out), 0);
  EXPECT_NE(out.find("(GPT-2, LLaMA, T5)"), std::string::npos) << out;
}

TEST_F(BadInputs, DataThatIsAFileAndShardsTokenizeWouldReplace) {
  write("afile", "hello");
  expect("train --model gpt-tiny --seq 16 --steps 1 --data afile --out run", 1,
         {"'afile' is a file; --data takes the directory"});
  write("text.txt",
        "Call me Ishmael. Some years ago, never mind how long precisely, having "
        "little or no money in my purse, I thought I would sail about a little.");
  expect("tokenize --input text.txt --out shards --val-fraction 0.2", 0, {"wrote"});
  expect("tokenize --input text.txt --out shards", 1, {"already holds train.bin", "--force"});
  expect("tokenize --input text.txt --out shards --val-fraction 0.2 --force", 0, {"wrote"});
}

// --device: a name that is not a device; cuda where this machine has no GPU (or the build no
// CUDA backend) says why, with the way on, before any step.
TEST_F(BadInputs, DevicesThatAreNotThereAreNamed) {
  const std::string run = "train --model gpt-tiny --seq 16 --steps 1 --data data --out run ";
  expect(run + "--device tpu", 1, {"--device 'tpu' is not a device", "--device cpu"});
  // Under launch, checked once before any rank starts.
  expect("launch -n 2 -- " + run + "--device tpu", 1, {"--device 'tpu' is not a device"});
  std::string out;
  run_command("cd " + dir_.string() + " && " + TESSERA_BINARY + " " + run + "--device cuda", &out);
  if (out.find("error:") != std::string::npos) {  // no GPU here (else it trains)
    EXPECT_NE(out.find("error: --device cuda: "), std::string::npos) << out;
    // Without a driver at all, the error says so (the CUDA runtime calls it too old: N14).
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY);
    if (driver == nullptr && out.find("built without the CUDA backend") == std::string::npos) {
      EXPECT_NE(out.find("no NVIDIA driver on this machine"), std::string::npos) << out;
    }
    if (driver != nullptr) dlclose(driver);
    EXPECT_NE(out.find("--device cpu"), std::string::npos) << out;
    EXPECT_EQ(out.find("internal error"), std::string::npos) << out;
  }
}

// Hints that name the real problem (bad-inputs-7d08d5e N16): an --out that is a file, a
// --mpirun that is not MPI's.
TEST_F(BadInputs, OutputsThatAreFilesAndLaunchersThatAreNotMpi) {
  write("afile", "mine");
  fs::create_directories(dir_ / "run");
  write("run/metrics.jsonl", "{\"step\":0,\"loss\":10.0,\"lr\":0.001}\n");
  expect("report run --out afile", 1, {"--out afile is a file; the report is a folder"});
  expect("launch -n 2 --mpirun /bin/false -- train --model gpt-tiny", 1,
         {"--mpirun /bin/false is not an MPI launcher: `/bin/false --version` exited with code 1"});
  expect("launch -n 2 --mpirun no-such-mpirun -- train --model gpt-tiny", 1,
         {"`no-such-mpirun --version` could not run"});
  // A --tp hint lists only the degrees that split the model's heads too (3, 6, 12 do not).
  expect("simulate llama2-7b --gpus 12 --tp 8 --batch 1 --seq 2048", 1,
         {"use a --tp that divides 12 and the model's 32 heads: 1, 2, 4"});
}

// Flags that would be silently ignored, or change nothing, are refused (bad-inputs-7d08d5e
// N11): interleaved with one chunk per stage, --virtual-stages 0, ZeRO-2 with stages on one
// data rank, --cluster without --plan auto, plan flags with plan --auto.
TEST_F(BadInputs, FlagsThatWouldBeIgnoredAreRefused) {
  expect("plan gpt-tiny --seq 16 --pp 2 --schedule interleaved", 1,
         {"the interleaved schedule with one virtual stage per stage is plain 1F1B"});
  expect("plan gpt-tiny --seq 16 --pp 2 --schedule interleaved --virtual-stages 0", 1,
         {"--virtual-stages must be at least 1, got 0"});
  expect("plan gpt-tiny --seq 16 --pp 2 --zero 2", 1,
         {"ZeRO-2 with pipeline parallelism is refused"});
  expect("train --model gpt-tiny --seq 16 --steps 1 --data data --out run --cluster dgx-h100", 1,
         {"--cluster dgx-h100 applies to --plan auto"});
  expect("plan --auto gpt-tiny --gpus 2 --seq 16 --tp 2", 1,
         {"--tp with --auto: the search chooses the plan"});
}

TEST_F(BadInputs, LaunchNamesAWrongCommandOnceBeforeStartingRanks) {
  expect("launch -n 2 -- frobnicate", 2, {"unknown command 'frobnicate'"});
  expect("launch -n 2 train --model gpt-tiny", 2,
         {"put -- between launch's flags and the command it runs: tessera launch -n 2 -- train "
          "--model gpt-tiny"});
}

// A run directory that already holds checkpoints is refused by launch's check, once; resuming
// with other schedule flags says which changed.
TEST_F(BadInputs, RunDirectoryCheckedOnceAndResumeChangesListed) {
  const std::string run =
      "train --model gpt-tiny --data data --seq 16 --batch 2 --sample-tokens 0 --out run ";
  expect(run + "--steps 1", 0, {"checkpoint saved"});
  std::string out;
  EXPECT_EQ(run_command("cd " + dir_.string() + " && " + TESSERA_BINARY + " launch -n 2 -- " + run +
                            "--steps 2",
                        &out),
            1);
  const size_t first = out.find("already holds checkpoints");
  ASSERT_NE(first, std::string::npos) << out;
  EXPECT_EQ(out.find("already holds checkpoints", first + 1), std::string::npos) << out;
  expect(run + "--steps 2 --resume --lr 0.01", 0,
         {"note: resumed with --lr 0.01 (was 0.002), --steps 2 (was 1)"});
  // 'latest' pointed back at step 1 while step 2 is there: refused before any step.
  write("run/checkpoints/latest", "step-00000001\n");
  expect(run + "--steps 3 --resume", 1, {"names step-00000001, but the newer step-00000002"});
}

TEST_F(BadInputs, CalibrateRefusesADirectoryBeforeMeasuring) {
  fs::create_directories(dir_ / "specs");
  expect("calibrate --out specs", 1, {"'specs' is a directory", "specs/cluster.toml"});
  expect("calibrate --out nowhere/spec.toml", 1, {"does not exist"});
  expect("calibrate --out spec.toml --precision fp8", 1,
         {"--precision must be fp32, bf16 or fp16 (or f32, f16), got 'fp8'"});
  expect("calibrate --out spec.toml --device tpu", 1, {"--device 'tpu' is not a device"});
  // Under launch, a device several ranks cannot share is one error, before any rank starts.
  std::string out;
  run_command("cd " + dir_.string() + " && " + TESSERA_BINARY +
                  " launch -n 2 -- calibrate --out spec.toml --device cuda",
              &out);
  EXPECT_NE(out.find("error: --device cuda"), std::string::npos) << out;
  EXPECT_EQ(out.find("error:"), out.rfind("error:")) << "one error, not one per rank\n" << out;
}

// calibrate --precision bf16 on the CPU: the spec carries the bf16 GEMM peak and its unaligned
// share, and the check on it predicts the bf16 step (same Program as train --precision bf16).
TEST_F(BadInputs, CalibrateMeasuresALowPrecisionRun) {
  std::string out;
  ASSERT_EQ(run_command("cd " + dir_.string() + " && " + TESSERA_BINARY +
                            " calibrate --model gpt-tiny --seq 32 --reps 1 --check 1 --precision "
                            "bf16 --out bf16.toml",
                        &out),
            0)
      << out;
  EXPECT_NE(out.find(" bf16 ("), std::string::npos) << out;
  EXPECT_NE(out.find("--precision bf16"), std::string::npos) << out;
  EXPECT_NE(out.find("peak memory per rank"), std::string::npos) << out;
  std::ifstream in(dir_ / "bf16.toml");
  const std::string spec((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(spec.find("peak_tflops_bf16"), std::string::npos) << spec;
  EXPECT_NE(spec.find("unaligned_gemm_efficiency"), std::string::npos) << spec;
}

TEST_F(BadInputs, ValidateTablesWithABomNoRowsOrNoGpus) {
  const std::string header =
      "row_id,source_key,model_name,architecture,layers,hidden,heads,seq_len,vocab,gpu_type,"
      "num_gpus,micro_batch,tokens_per_s_per_gpu\n";
  write("header_only.csv", header);
  expect("validate --csv header_only.csv --threads 1", 1, {"a header and no rows"});
  write("bom.csv",
        "\xEF\xBB\xBF" + header + "1,src,GPT,GPT-2,12,768,12,1024,50257,A100 80GB,-8,1,1000\n");
  // Nothing compared is a failure (a CI job must not pass on rows it never read), with each
  // row's reason, for the simulator and the planner (bad-inputs-7d08d5e N7).
  expect("validate --csv bom.csv --threads 1", 1,
         {"num_gpus='-8' is not a positive integer", "0 rows simulated, 1 not modelled",
          "error: no row of bom.csv was compared (1 not modelled"});
  expect("validate --planner --rows --csv bom.csv --threads 1", 1,
         {"over 0 rows: -; 0 without a plan", "rows not modelled (1):",
          "num_gpus='-8' is not a positive integer", "error: no row of bom.csv was compared"});
}

// --precision fp8 (the blocks' GEMMs in FP8 beside bf16) where the device has FP8 tensor
// cores; one error naming the missing peak where it has none, for simulate and plan --auto.
TEST_F(BadInputs, Fp8NeedsADeviceWithAnFp8Peak) {
  expect("simulate gpt2-small --gpus 8 --seq 1024 --cluster dgx-h100 --precision fp8", 0,
         {", fp8\n", "MFU"});
  expect("plan gpt2-small --auto --gpus 8 --seq 1024 --cluster dgx-h100 --precision fp8 --top 1", 0,
         {"tokens per step in fp8: "});
  for (const char* cmd : {"simulate gpt2-small --gpus 8 --cluster dgx-a100 --precision fp8",
                          "plan gpt2-small --auto --gpus 8 --cluster dgx-a100 --precision fp8"})
    expect(cmd, 1, {"A100-SXM4-80GB has no FP8 peak (peak_tflops_fp8 in its [device])"});
  expect("simulate gpt2-small --precision fp4", 1,
         {"--precision 'fp4' is not one of f32 (fp32), bf16, f16 (fp16), fp8"});
  // One spelling per concept, both accepted everywhere (bad-inputs-7d08d5e N13): train's
  // fp16 in simulate and export, simulate's f16 in train.
  expect("simulate gpt-tiny --gpus 1 --seq 16 --precision fp16", 0, {"per step, f16"});
  expect("simulate gpt-tiny --gpus 1 --seq 16 --precision fp32", 0, {"per step, f32"});
}

TEST_F(BadInputs, ATopologyTheSimulatorDoesNotModelIsSaid) {
  expect("simulate llama2-7b --gpus 16 --seq 2048 --cluster frontier", 0,
         {"the dragonfly network is timed as a fat tree"});
  std::string out;
  run_command(std::string(TESSERA_BINARY) + " simulate llama2-7b --gpus 16 --seq 2048", &out);
  EXPECT_EQ(out.find("timed as a fat tree"), std::string::npos) << out;
}

}  // namespace
}  // namespace tessera
