// End-to-end training runs in-process on a tiny model and a synthetic token file: exact resume,
// and the user mistakes that must give one clear error and leave saved work intact.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli/commands.h"
#include "data/token_shards.h"
#include "train_fixture.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class TrainTest : public TrainDirTest {
 protected:
  TrainOptions options(const std::string& out) const {
    TrainOptions o = tiny_options(out);
    o.steps = 20;
    o.warmup = 3;
    o.eval_every = 10;
    o.eval_batches = 2;
    o.ckpt_every = 5;
    return o;
  }

  static std::vector<std::string> losses(const fs::path& m) { return metric_losses(m); }
};

TEST_F(TrainTest, ResumeContinuesExactly) {
  Status s = run_train(options("straight"));
  ASSERT_TRUE(s.ok()) << s.to_string();
  TrainOptions first = options("resumed");
  first.stop_after = 10;
  s = run_train(first);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(losses(dir_ / "resumed/metrics.jsonl").size(), 10u);
  TrainOptions second = options("resumed");
  second.resume = true;
  s = run_train(second);
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::vector<std::string> a = losses(dir_ / "straight/metrics.jsonl");
  std::vector<std::string> b = losses(dir_ / "resumed/metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b) << "10 + resume + 10 steps must reproduce 20 straight steps bit for bit";
  // The loss fell on the learnable stream.
  EXPECT_LT(std::stod(a.back().substr(7)), std::stod(a.front().substr(7)));
}

// A weighted mixture of two folders trains, stops and resumes bit for bit; its checkpoint
// does not resume a run on one folder.
TEST_F(TrainTest, AMixtureOfFoldersResumesExactly) {
  write_learnable_tokens(dir_ / "more");
  const std::string mix = (dir_ / "data").string() + "=0.7," + (dir_ / "more").string() + "=0.3";
  TrainOptions straight = options("mix_straight");
  straight.data = mix;
  ASSERT_TRUE(run_train(straight).ok());
  TrainOptions first = options("mix_resumed");
  first.data = mix;
  first.stop_after = 10;
  ASSERT_TRUE(run_train(first).ok());
  TrainOptions second = first;
  second.stop_after = 0;
  second.resume = true;
  Status s = run_train(second);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const std::vector<std::string> a = losses(dir_ / "mix_straight/metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(losses(dir_ / "mix_resumed/metrics.jsonl"), a);
  TrainOptions one = options("mix_resumed");
  one.resume = true;
  one.steps = 30;
  s = run_train(one);
  EXPECT_NE(s.message().find("of a mixture of folders"), std::string::npos) << s.to_string();
  TrainOptions bad = options("mix_bad");
  bad.data = (dir_ / "data").string() + "=0.7," + (dir_ / "nowhere").string() + "=0.3";
  s = run_train(bad);
  EXPECT_NE(s.message().find("nowhere' does not exist"), std::string::npos) << s.to_string();
}

// Resuming with another model names the keys that differ, not two whole configs.
TEST_F(TrainTest, ResumeWithAnotherModelNamesTheKeysThatDiffer) {
  TrainOptions first = options("run");
  first.steps = 2;
  ASSERT_TRUE(run_train(first).ok());
  TrainOptions other = options("run");
  other.model = "gpt-mini";
  other.resume = true;
  Status s = run_train(other);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("was written by another model (gpt-tiny): "), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("n_embd 64 there, 192 here"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("{"), std::string::npos) << s.message();
}

// Each step's record carries the model FLOP/s per rank and the MFU against the given peak.
TEST_F(TrainTest, MetricsCarryModelFlopsAndMfu) {
  TrainOptions o = options("run");
  o.steps = 3;
  o.peak_flops = 1e12;
  ASSERT_TRUE(run_train(o).ok());
  std::ifstream in(dir_ / "run/metrics.jsonl");
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    ++steps;
    const double flops = j.at("flops_per_s_per_rank"), step_s = j.at("step_s");
    EXPECT_GT(flops, 0);
    EXPECT_EQ(j.at("peak_flops_per_rank").get<double>(), 1e12);
    EXPECT_DOUBLE_EQ(j.at("mfu").get<double>(), flops / 1e12);
    // The model's FLOPs in a step: 2 B T x (6 N-ish) for gpt-tiny is over a few MFLOP.
    EXPECT_GT(flops * step_s, 1e6);
    EXPECT_FALSE(j.contains("gemm_flops_per_rank"));  // a given peak: nothing measured
  }
  EXPECT_EQ(steps, 3);
  // The summary: the steady steps' rate with the first step apart, and the peak named (the CPU
  // has no datasheet: its measured GEMM rate).
  std::string out;
  ASSERT_EQ(run_command(std::string(TESSERA_BINARY) + " train --model gpt-tiny --data " +
                            (dir_ / "data").string() + " --out " + (dir_ / "cli").string() +
                            " --seq 16 --batch 2 --steps 3 --sample-tokens 0 --eval-every 0",
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("trained 3 steps in "), std::string::npos) << out;
  EXPECT_NE(out.find("): first step "), std::string::npos) << out;
  EXPECT_NE(out.find("; steps 2-3: "), std::string::npos) << out;
  EXPECT_NE(out.find("FLOP/s (this rank's measured GEMM rate)\n"), std::string::npos) << out;
  std::ifstream cli(dir_ / "cli/metrics.jsonl");
  ASSERT_TRUE(std::getline(cli, line));
  EXPECT_EQ(nlohmann::json::parse(line).at("gemm_flops_per_rank"),
            nlohmann::json::parse(line).at("peak_flops_per_rank"));
}

TEST_F(TrainTest, MissingDataPathIsNamed) {
  TrainOptions o = options("run");
  o.data = (dir_ / "nope").string();
  Status s = run_train(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("nope"), std::string::npos) << s.message();
  EXPECT_NE(s.hint().find("tessera tokenize"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "run"));
}

TEST_F(TrainTest, ConfigKeyOfWrongTypeIsNamed) {
  std::ofstream(dir_ / "model.toml") << "[model]\npreset = \"gpt-tiny\"\nn_head = \"4\"\n";
  TrainOptions o = options("run");
  o.model = (dir_ / "model.toml").string();
  Status s = run_train(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.to_string().find("n_head"), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find("model.toml"), std::string::npos) << s.to_string();
}

TEST_F(TrainTest, HeadsNotDividingWidthIsRejected) {
  std::ofstream(dir_ / "model.toml") << "[model]\npreset = \"gpt-tiny\"\nn_head = 5\n";
  TrainOptions o = options("run");
  o.model = (dir_ / "model.toml").string();
  Status s = run_train(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("n_head = 5 does not divide n_embd = 64"), std::string::npos)
      << s.message();
}

TEST_F(TrainTest, CorruptCheckpointIsRefusedAndNotOverwritten) {
  TrainOptions o = options("run");
  o.steps = 5;
  ASSERT_TRUE(run_train(o).ok());
  fs::path model = dir_ / "run/checkpoints/step-00000005/model.safetensors";
  ASSERT_TRUE(fs::exists(model));
  {  // Flip one byte in the middle of the parameters.
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(model) / 2));
    f.put('\x5a');
  }
  auto before = fs::file_size(model);
  TrainOptions r = o;
  r.resume = true;
  r.steps = 10;
  Status s = run_train(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos) << s.message();
  EXPECT_EQ(fs::file_size(model), before);
  // Starting a fresh run into the same directory would overwrite it: refused.
  s = run_train(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.hint().find("--resume"), std::string::npos) << s.to_string();
}

TEST_F(TrainTest, TokenIdsBeyondTheVocabularyAreRejected) {
  std::vector<int32_t> bad(200, 5);
  bad[123] = 60000;
  ASSERT_TRUE(write_token_shard((dir_ / "data/train.bin").string(), bad, 65536).ok());
  Status s = run_train(options("run"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("train.bin"), std::string::npos) << s.message();
}

// --precision bf16 / fp16: the losses follow fp32's, and a run resumes exactly (checkpoints
// hold the f32 master weights and moments, and fp16's loss scale). Pipelines in bf16 and fp16:
// tests/runtime/pipeline_runner_test.cc, tests/cli/distributed_train_test.cc.
TEST_F(TrainTest, LowPrecisionFollowsFp32AndResumesExactly) {
  ASSERT_TRUE(run_train(options("fp32")).ok());
  const std::vector<std::string> a = losses(dir_ / "fp32/metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  for (const char* precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const std::string name = precision;
    TrainOptions low = options(name);
    low.precision = precision;
    Status s = run_train(low);
    ASSERT_TRUE(s.ok()) << s.to_string();
    const std::vector<std::string> b = losses(dir_ / name / "metrics.jsonl");
    ASSERT_EQ(b.size(), 20u);
    for (size_t k = 0; k < a.size(); ++k)
      EXPECT_NEAR(std::stod(b[k].substr(7)), std::stod(a[k].substr(7)),
                  0.02 * std::stod(a[k].substr(7)))
          << "step " << k;
    TrainOptions half = options(name + "_resumed");
    half.precision = precision;
    half.stop_after = 10;
    ASSERT_TRUE(run_train(half).ok());
    half.stop_after = 0;
    half.resume = true;
    s = run_train(half);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(losses(dir_ / (name + "_resumed") / "metrics.jsonl"), b);
  }
  std::ifstream fp16(dir_ / "fp16/metrics.jsonl");
  std::string first;
  std::getline(fp16, first);
  EXPECT_NE(first.find("\"loss_scale\":65536"), std::string::npos) << first;

  // An fp16 checkpoint resumed in bf16 scales nothing (its records carry no loss_scale).
  TrainOptions half = options("fp16_then_bf16");
  half.precision = "fp16";
  half.stop_after = 10;
  ASSERT_TRUE(run_train(half).ok());
  half.precision = "bf16";
  half.stop_after = 0;
  half.resume = true;
  Status s = run_train(half);
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::ifstream switched(dir_ / "fp16_then_bf16/metrics.jsonl");
  std::string line, last;
  while (std::getline(switched, line))
    if (line.find("grad_norm") != std::string::npos) last = line;
  EXPECT_NE(last.find("\"step\":19"), std::string::npos) << last;
  EXPECT_EQ(last.find("loss_scale"), std::string::npos) << last;
}

// Runs the tessera binary with `args`; returns its exit code and puts stdout+stderr in *out.
int run_tessera(const std::string& args, std::string* out) {
  std::string cmd = std::string(TESSERA_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) *out += buf;
  return WEXITSTATUS(pclose(p));
}

// The binary itself: an unknown flag gives one message and exit code 2.
TEST(TesseraBinary, UnknownFlagExitsWithUsageError) {
  std::string out;
  EXPECT_EQ(run_tessera("train --bogus-flag", &out), 2) << out;
  EXPECT_NE(out.find("--bogus-flag"), std::string::npos) << out;
  EXPECT_EQ(out.find("terminate"), std::string::npos) << out;
}

// A mistyped command is named with the nearest one; `help` and --version answer; a negative
// --seed is refused (it wrapped to 2^64 - 1); running out of memory is one error, not an abort.
TEST(TesseraBinary, CommandsVersionSeedAndOutOfMemory) {
  std::string out;
  EXPECT_EQ(run_tessera("trian --steps 1", &out), 2) << out;
  EXPECT_NE(out.find("error: unknown command 'trian' (did you mean train?)"), std::string::npos)
      << out;
  out.clear();
  EXPECT_EQ(run_tessera("help", &out), 0) << out;
  EXPECT_NE(out.find("Run `tessera COMMAND --help`"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run_tessera("--version", &out), 0) << out;
  EXPECT_EQ(out.rfind("tessera ", 0), 0u) << out;
  out.clear();
  EXPECT_EQ(run_tessera("train --seed -1 --steps 1", &out), 2) << out;
  EXPECT_NE(out.find("error: --seed: must be 0 or positive, got -1"), std::string::npos) << out;
  // llama3-8b's 32 GB of f32 parameters under a 3 GB address-space limit.
  out.clear();
  const std::string dir = ::testing::TempDir() + "/tessera_oom_run";
  const std::string cmd = "sh -c 'ulimit -v 3000000; " + std::string(TESSERA_BINARY) +
                          " train --model llama3-8b --seq 16 --batch 1 --steps 1 --out " + dir +
                          " --sample-tokens 0'";
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  EXPECT_EQ(WEXITSTATUS(pclose(p)), 1) << out;
  EXPECT_NE(out.find("error: out of memory"), std::string::npos) << out;
  EXPECT_EQ(out.find("terminate"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

TEST(TesseraBinary, UnknownPresetListsPresets) {
  std::string out;
  EXPECT_EQ(run_tessera("graph gpt-9000", &out), 1) << out;
  EXPECT_NE(out.find("unknown model preset \"gpt-9000\""), std::string::npos) << out;
  EXPECT_NE(out.find("gpt2-small"), std::string::npos) << out;
}

// Bad inputs from the review (bad-inputs-cd173a2.md) that used to pass silently: each is one
// `error:` naming the key or flag, exit 1, before any work.
TEST(TesseraBinary, SizesTablesCountsAndDirectoriesAreChecked) {
  std::string out;
  // `tessera graph` on a config of gpt-tiny plus `extra`: exit 1 with `want` in the error.
  auto refused_config = [&](const std::string& name, const std::string& extra,
                            const std::string& want) {
    const std::string path = ::testing::TempDir() + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(("[model]\npreset = \"gpt-tiny\"\n" + extra).c_str(), f);
    std::fclose(f);
    out.clear();
    EXPECT_EQ(run_tessera("graph " + path, &out), 1) << out;
    EXPECT_NE(out.find("error: "), std::string::npos) << out;
    EXPECT_NE(out.find(want), std::string::npos) << out;
  };
  // n_embd = 4e9 printed a negative parameter count.
  refused_config("huge.toml", "n_embd = 4000000000\n", "key 'n_embd' = 4000000000 is over");
  refused_config("wide.toml", "n_embd = 1048576\nn_layer = 1024\n", "parameters, over the 1e15");
  // An unknown top-level table was ignored.
  refused_config("table.toml", "[optim]\nlr = 1.0\n", "unknown key 'optim' at the top level");
  // calibrate --reps 0 wrote a spec of inf and NaN with exit 0.
  out.clear();
  const std::string spec = ::testing::TempDir() + "/reps0.toml";
  EXPECT_EQ(run_tessera("calibrate --reps 0 --out " + spec, &out), 1) << out;
  EXPECT_NE(out.find("error: --reps must be at least 1, got 0"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(spec));
  // validate --cluster-dir with a typo simulated nothing and exited 0.
  out.clear();
  EXPECT_EQ(run_tessera("validate --cluster-dir /no/such/dir", &out), 1) << out;
  EXPECT_NE(out.find("error: --cluster-dir /no/such/dir is not a directory"), std::string::npos)
      << out;
  out.clear();
  const std::string empty = ::testing::TempDir() + "/empty_cluster_dir";
  std::filesystem::create_directories(empty);
  EXPECT_EQ(run_tessera("validate --cluster-dir " + empty, &out), 1) << out;
  EXPECT_NE(out.find("no row could be simulated"), std::string::npos) << out;
  EXPECT_NE(out.find(empty + "/"), std::string::npos) << "names the missing spec: " << out;
}

// A plan file with two pipeline stages.
std::string write_pipeline_plan() {
  const std::string path = ::testing::TempDir() + "/pipeline_plan.json";
  std::FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("{\"mesh\": [{\"name\": \"pp\", \"size\": 2}], \"micro_batches\": 2}\n", f);
  std::fclose(f);
  return path;
}

// Bad parallelism flags: one `error:` paragraph naming the flag, exit 1, before any work.
TEST(TesseraBinary, BadParallelFlagsAreNamed) {
  std::string out;
  EXPECT_EQ(run_tessera("train --tp 0 --steps 1", &out), 1) << out;
  EXPECT_NE(out.find("error: --tp must be positive, got 0"), std::string::npos) << out;
  EXPECT_EQ(run_tessera("simulate gpt-tiny --tp 3 --gpus 8", &out), 1) << out;
  EXPECT_NE(out.find("error: --tp 3 does not divide the 8 ranks"), std::string::npos) << out;
  // 8 would divide the ranks but not gpt-tiny's 4 heads.
  EXPECT_NE(out.find("divides 8 and the model's 4 heads: 1, 2, 4\n"), std::string::npos) << out;
  EXPECT_EQ(run_tessera("plan gpt-tiny --recompute some", &out), 1) << out;
  EXPECT_NE(out.find("not one of: none, full, selective"), std::string::npos) << out;
  for (const char* bad : {"--comm-timeout 0", "--eval-batches 0", "--clip -1", "--min-lr-frac 2",
                          "--keep-ckpts -1", "--lr nan"}) {
    EXPECT_EQ(run_tessera(std::string("train --model gpt-tiny --seq 32 --steps 1 ") + bad, &out), 1)
        << bad << "\n"
        << out;
    EXPECT_EQ(out.rfind("error: --", 0), 0u) << bad << "\n" << out;
  }
  for (const char* bad :
       {"plan gpt-tiny --batch 0", "plan gpt-tiny --seq -5", "graph gpt-tiny --seq -5",
        "simulate gpt-tiny --seq -1", "simulate gpt-tiny --batch -2", "plan gpt-tiny --seq 1000"}) {
    EXPECT_EQ(run_tessera(bad, &out), 1) << bad << "\n" << out;
    EXPECT_EQ(out.rfind("error: --", 0), 0u) << bad << "\n" << out;
  }
  EXPECT_EQ(run_tessera("simulate gpt-tiny --gpus 0", &out), 1) << out;
  EXPECT_NE(out.find("error: --gpus must be between 1 and 1048576, got 0"), std::string::npos)
      << out;
  EXPECT_EQ(run_tessera("simulate gpt-tiny --gpus 2147483647", &out), 1) << out;
  // Pipelines: more chunks than blocks, cuts that do not sum, schedules and stages that do not
  // fit together.
  const std::pair<const char*, const char*> pipeline_cases[] = {
      {"simulate gpt-tiny --gpus 4 --pp 4", "is 4 model chunks, but gpt-tiny has 2 blocks"},
      {"simulate gpt-tiny --gpus 4 --pp 2 --stage-layers 1,2", "summing to 2"},
      {"simulate gpt-tiny --gpus 4 --pp 2 --virtual-stages 2", "needs the interleaved schedule"},
      {"simulate gpt-tiny --gpus 4 --pp 2 --schedule zigzag", "not one of: gpipe, 1f1b"},
      {"simulate gpt-tiny --schedule 1f1b", "need pipeline stages"},
      {"simulate gpt-tiny --gpus 4 --pp 2 --zero 3", "ZeRO-3 with pipeline parallelism"},
      {"simulate gpt-tiny --gpus 6 --pp 4", "does not divide the 6 ranks"},
      {"plan gpt-mini --pp 2 --schedule interleaved --virtual-stages 2 --grad-accum 3 --seq 64",
       "multiple"}};
  for (const auto& [args, what] : pipeline_cases) {
    out.clear();
    EXPECT_EQ(run_tessera(args, &out), 1) << args << "\n" << out;
    EXPECT_EQ(out.rfind("error: ", 0), 0u) << args << "\n" << out;
    EXPECT_NE(out.find(what), std::string::npos) << args << "\n" << out;
  }
  EXPECT_EQ(run_tessera("simulate gpt-mini --gpus 8 --pp 2 --tp 2 --grad-accum 4 --seq 64", &out),
            0)
      << out;
  EXPECT_NE(out.find("pipeline         bubble"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run_tessera("plan gpt-tiny --plan " + write_pipeline_plan(), &out), 0) << out;
  EXPECT_NE(out.find("stage 1"), std::string::npos) << out;
  // train checks a pipeline in one process before launching its ranks.
  const std::pair<const char*, const char*> train_pipeline_cases[] = {
      {"launch -n 4 -- train --model gpt-tiny --seq 32 --pp 4", "is 4 model chunks"},
      {"launch -n 4 -- train --model gpt-tiny --seq 32 --pp 2 --zero 3",
       "ZeRO-3 with pipeline parallelism"},
      {"launch -n 2 -- train --model gpt-tiny --seq 32 --pp 2 --stage-layers 2,1", "summing to 2"},
      {"train --model gpt-tiny --seq 32 --pp 2", "needs one process per rank"}};
  for (const auto& [args, what] : train_pipeline_cases) {
    out.clear();
    EXPECT_EQ(run_tessera(args, &out), 1) << args << "\n" << out;
    EXPECT_EQ(out.rfind("error: ", 0), 0u) << args << "\n" << out;
    EXPECT_NE(out.find(what), std::string::npos) << args << "\n" << out;
  }
  EXPECT_EQ(run_tessera("plan gpt-tiny --sequence-parallel", &out), 1) << out;
  EXPECT_NE(out.find("sequence parallelism needs a tensor axis"), std::string::npos) << out;
  EXPECT_EQ(run_tessera("sample --checkpoint /nonexistent --temperature -1", &out), 1) << out;
  EXPECT_NE(out.find("error: --temperature must be 0 (greedy) or positive"), std::string::npos)
      << out;
}

// launch checks train's plan for N ranks in one process before it starts any: one error.
TEST(TesseraBinary, LaunchRefusesAnImpossiblePlanOnceBeforeStartingRanks) {
  std::string out;
  EXPECT_EQ(run_tessera("launch -n 3 -- train --model gpt-tiny --seq 32 --hsdp 2", &out), 1) << out;
  const std::string e = "error: --hsdp 2 does not divide the 3 data-parallel ranks";
  ASSERT_NE(out.find(e), std::string::npos) << out;
  EXPECT_EQ(out.find(e, out.find(e) + 1), std::string::npos) << "printed more than once:\n" << out;
  EXPECT_EQ(out.find("mpirun"), std::string::npos) << out;
  EXPECT_EQ(run_tessera("launch -n 4 -- train --model gpt-tiny --seq 32 --tp 2 --batch 3", &out), 1)
      << out;
  EXPECT_NE(out.find("--batch 3 (the global micro-batch) does not split over 2"), std::string::npos)
      << out;
}

// launch --elastic restarts training runs planned from flags; its own flags are checked.
TEST(TesseraBinary, LaunchElasticRefusesWhatItCannotRestart) {
  const std::pair<const char*, const char*> cases[] = {
      {"launch -n 2 --elastic -- sample --checkpoint x", "--elastic restarts a training run"},
      {"launch -n 2 --elastic --min-ranks 3 -- train --model gpt-tiny",
       "--min-ranks 3 must be between 1 and -n (2)"},
      {"launch -n 2 --min-ranks 1 -- train --model gpt-tiny", "--min-ranks applies to --elastic"},
      {"launch -n 2 --elastic -- train --model gpt-tiny --plan auto",
       "--elastic plans the job again for the ranks left"},
      {"launch -n 3 --elastic -- train --model gpt-tiny --seq 32 --hsdp 2",
       "--hsdp 2 does not divide the 3 data-parallel ranks"},
  };
  for (const auto& [args, what] : cases) {
    std::string out;
    EXPECT_EQ(run_tessera(args, &out), 1) << args << "\n" << out;
    EXPECT_EQ(out.rfind("error: ", 0), 0u) << args << "\n" << out;
    EXPECT_NE(out.find(what), std::string::npos) << args << "\n" << out;
    EXPECT_EQ(out.find("mpirun"), std::string::npos) << args << "\n" << out;
  }
}

// Tensor parallelism inside HSDP groups: one mesh of three axes, ZeRO-3 over dp_shard only.
TEST(TesseraBinary, TensorParallelInsideHsdpIsOnePlan) {
  std::string out;
  ASSERT_EQ(run_tessera("plan gpt2-small --dp 4 --tp 2 --hsdp 2 --seq 256", &out), 0) << out;
  EXPECT_NE(out.find("plan            dp_rep=2 x dp_shard=2 x tp=2 zero=3 (HSDP)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("S(0) on tp"), std::string::npos) << out;
  EXPECT_EQ(run_tessera("plan gpt2-small --dp 4 --tp 2 --hsdp 3 --seq 256", &out), 1) << out;
  EXPECT_NE(out.find("error: --hsdp 3 does not divide the 4 data-parallel ranks"),
            std::string::npos)
      << out;
}

// simulate --json: one JSON object on stdout, its figures consistent with each other and with
// the text report of the same run.
// --offload on plan, simulate and train: the host's bytes printed, the offloaded phase in
// the figures, and what cannot be offloaded yet refused by name.
TEST(TesseraBinary, OffloadIsAFlagOfPlanSimulateAndTrain) {
  std::string out;
  ASSERT_EQ(run_tessera("plan gpt-tiny --batch 2 --seq 32 --offload optimizer", &out), 0) << out;
  EXPECT_NE(out.find("optimizer 0 B"), std::string::npos) << out;
  EXPECT_NE(out.find("host per rank"), std::string::npos) << out;
  std::string json;
  ASSERT_EQ(run_tessera("simulate gpt2-small --cluster dgx-h100 --gpus 8 --seq 1024 --offload "
                        "optimizer --json",
                        &json),
            0)
      << json;
  nlohmann::json j = nlohmann::json::parse(json);
  EXPECT_GT(j["offload_s"].get<double>(), 0);
  EXPECT_GT(j["host_bytes_per_device"].get<double>(), 0);
  EXPECT_EQ(j["plan"]["offload"], "optimizer");
  out.clear();  // (run_tessera appends)
  EXPECT_EQ(run_tessera("plan gpt-tiny --offload everything", &out), 1) << out;
  EXPECT_NE(
      out.find("error: --offload: offload 'everything' is not one of: none, optimizer, params"),
      std::string::npos)
      << out;
  out.clear();
  EXPECT_EQ(run_tessera("plan gpt-tiny --offload params", &out), 1) << out;
  EXPECT_NE(out.find("error: plan: offloading the parameters needs ZeRO-3 (zero = 0)"),
            std::string::npos)
      << out;
  // With ZeRO-3 the parameters leave the device too: none between steps, their blocks in the
  // host's bytes, copied in over the host link.
  out.clear();
  ASSERT_EQ(run_tessera("plan gpt-tiny --batch 2 --seq 32 --zero 3 --offload params", &out), 0)
      << out;
  EXPECT_NE(out.find("parameters 0 B"), std::string::npos) << out;
  EXPECT_NE(out.find("the parameter blocks, copied in for each gather"), std::string::npos) << out;
  json.clear();
  const std::string sim = "simulate gpt2-small --cluster dgx-h100 --gpus 8 --seq 1024 --zero 3 ";
  ASSERT_EQ(run_tessera(sim + "--offload params --json", &json), 0) << json;
  const nlohmann::json params = nlohmann::json::parse(json);
  json.clear();
  ASSERT_EQ(run_tessera(sim + "--offload optimizer --json", &json), 0) << json;
  const nlohmann::json optimizer = nlohmann::json::parse(json);
  EXPECT_LT(params["peak_bytes_per_device"].get<double>(),
            optimizer["peak_bytes_per_device"].get<double>());
  EXPECT_GT(params["host_bytes_per_device"].get<double>(),
            optimizer["host_bytes_per_device"].get<double>());
  EXPECT_GT(params["offload_s"].get<double>(), optimizer["offload_s"].get<double>());
  out.clear();
  EXPECT_EQ(
      run_tessera("simulate gpt-tiny --cluster dgx-h100 --gpus 2 --pp 2 --offload optimizer", &out),
      1)
      << out;
  EXPECT_NE(out.find("not supported with pipeline stages yet"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run_tessera("train --model gpt-tiny --seq 32 --steps 1 --offload maybe", &out), 1)
      << out;
  EXPECT_EQ(out.rfind("error: --offload", 0), 0u) << out;
}

TEST(TesseraBinary, SimulateJsonIsOneObjectOfTheFigures) {
  const std::string args = "simulate gpt2-small --cluster dgx-a100 --gpus 8 --tp 2 --seq 1024";
  std::string out, text;
  ASSERT_EQ(run_tessera(args + " --json", &out), 0) << out;
  ASSERT_EQ(out.front(), '{') << out;
  nlohmann::json j = nlohmann::json::parse(out);
  for (const char* key : {"step_s", "tokens_per_s", "mfu", "hfu", "peak_bytes_per_device", "fits",
                          "plan", "devices", "exposed_comm_s"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["devices"], 8);
  EXPECT_EQ(j["precision"], "bf16");
  EXPECT_EQ(j["plan"]["mesh"][1]["name"], "tp");
  EXPECT_EQ(j["plan"]["mesh"][1]["size"], 2);
  const double step = j["step_s"];
  EXPECT_GT(step, 0);
  EXPECT_NEAR(j["tokens_per_s"].get<double>(), j["tokens_per_step"].get<double>() / step,
              1e-6 * j["tokens_per_s"].get<double>());
  EXPECT_GT(j["mfu"].get<double>(), 0);
  EXPECT_LE(j["mfu"].get<double>(), j["hfu"].get<double>());
  EXPECT_EQ(j["fits"].get<bool>(),
            j["peak_bytes_per_device"].get<double>() <= j["device_memory_bytes"].get<double>());
  ASSERT_EQ(run_tessera(args, &text), 0) << text;
  char line[64];
  std::snprintf(line, sizeof line, "%.1f%%", 100 * j["mfu"].get<double>());
  EXPECT_NE(text.find(line), std::string::npos) << line << " not in\n" << text;
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// `plan --auto --json`: the fastest fitting plans, best first, each a plan `simulate --plan`
// reproduces; the search's flags without --auto are refused.
TEST(TesseraBinary, PlanAutoPrintsTheFastestFittingPlansAsJson) {
  std::string out;
  ASSERT_EQ(
      run_tessera("plan gpt2-small --auto --gpus 8 --batch 16 --seq 1024 --top 3 --json", &out), 0)
      << out;
  nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_EQ(j["candidates"].size(), 3u) << out;
  EXPECT_GT(j["enumerated"].get<int>(), j["simulated"].get<int>());
  double last = 0;
  for (const nlohmann::json& c : j["candidates"]) {
    EXPECT_GE(c["step_s"].get<double>(), last);
    last = c["step_s"].get<double>();
    EXPECT_TRUE(c["fits"].get<bool>());
  }
  const std::string plan = testing::TempDir() + "/auto_plan.json";
  std::ofstream(plan) << j["candidates"][0]["plan"].dump();
  std::string sim;
  ASSERT_EQ(run_tessera("simulate gpt2-small --seq 1024 --json --plan " + plan + " --batch " +
                            j["candidates"][0]["global_micro_batch"].dump(),
                        &sim),
            0)
      << sim;
  nlohmann::json s = nlohmann::json::parse(sim);
  // The same Program timed: the plan file holds the micro-batches and placements.
  EXPECT_NEAR(s["step_s"].get<double>(), j["candidates"][0]["step_s"].get<double>(),
              1e-6 * s["step_s"].get<double>());
  EXPECT_EQ(run_tessera("plan gpt2-small --json", &out), 1) << out;
  EXPECT_NE(out.find("error: --json, --cluster, --gpus, --top, --explain, --compare and --tokens "
                     "go with --auto"),
            std::string::npos)
      << out;
}

// --explain adds why the best plan wins; --compare prints the best plan on each cluster with the
// time to train and the cost at each spec's price (none where the spec has no price).
TEST(TesseraBinary, PlanAutoExplainsTheBestPlanAndComparesClustersByCost) {
  std::string out;
  const std::string base = "plan gpt2-small --auto --gpus 8 --batch 16 --seq 1024 ";
  auto run = [&](const std::string& flags) {
    out.clear();
    return run_tessera(base + flags, &out);
  };
  ASSERT_EQ(run("--explain --json"), 0) << out;
  nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_TRUE(j.contains("explain")) << out;
  EXPECT_GE(j["explain"]["knobs"].size(), 5u) << out;
  EXPECT_EQ(j["explain"]["what_ifs"].size(), 4u) << out;
  ASSERT_EQ(run("--explain"), 0) << out;
  EXPECT_NE(out.find(" wins ("), std::string::npos) << out;
  EXPECT_NE(out.find("  recompute: "), std::string::npos) << out;

  ASSERT_EQ(run("--compare dgx-a100,dgx-h100,frontier --tokens 1e9 --json"), 0) << out;
  j = nlohmann::json::parse(out);
  ASSERT_EQ(j["clusters"].size(), 3u) << out;
  for (const nlohmann::json& c : j["clusters"]) {
    const double tps = c["best"]["tokens_per_s"].get<double>();
    EXPECT_NEAR(c["days"].get<double>(), 1e9 / tps / 86400, 1e-9) << c.dump();
    const double price = c["price_per_device_hour"].get<double>();
    if (price > 0)
      EXPECT_NEAR(c["usd_per_million_tokens"].get<double>(), price * 8 / 3600 / tps * 1e6, 1e-9);
    else
      EXPECT_TRUE(c["usd_per_million_tokens"].is_null()) << c.dump();
  }
  EXPECT_EQ(j["clusters"][2]["cluster"], "frontier");
  EXPECT_LT(j["clusters"][1]["best"]["step_s"].get<double>(),
            j["clusters"][0]["best"]["step_s"].get<double>());  // H100 beats A100
  EXPECT_EQ(run("--compare dgx-a100,nowhere"), 1) << out;
  EXPECT_NE(out.find("error: unknown cluster 'nowhere'"), std::string::npos) << out;
  EXPECT_EQ(run("--compare dgx-a100 --explain"), 1) << out;
  EXPECT_NE(out.find("error: --explain and --compare"), std::string::npos) << out;
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// `train --model vit-tiny` on Debian's Fashion-MNIST (installed by scripts/install_deps.sh)
// learns: validation accuracy well above chance (10%) within 150 steps; image models refuse a
// --seq of their own and a folder without images, and `sample` refuses their checkpoints.
TEST(TesseraBinary, VitTinyLearnsFashionMnist) {
  const std::string dir = ::testing::TempDir() + "/tessera_vit_run";
  std::filesystem::remove_all(dir);
  std::string out;
  EXPECT_EQ(run_tessera("train --model vit-tiny --seq 64 --steps 1 --out " + dir, &out), 1) << out;
  EXPECT_NE(out.find("reads images as 17 tokens"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run_tessera(
                "train --model vit-tiny --data " + ::testing::TempDir() + " --steps 1 --out " + dir,
                &out),
            1)
      << out;
  EXPECT_NE(out.find("train-images-idx3-ubyte"), std::string::npos) << out;
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  out.clear();
  ASSERT_EQ(run_tessera("train --model vit-tiny --batch 32 --steps 150 --lr 2e-3 --eval-every 0 "
                        "--eval-batches 20 --out " +
                            dir,
                        &out),
            0)
      << out;
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line))
    if (line.find("val_accuracy") != std::string::npos) last = line;
  const auto p = last.find("\"val_accuracy\":");
  ASSERT_NE(p, std::string::npos) << out;
  const double acc = std::stod(last.substr(p + 15));
  std::printf("vit-tiny, 150 steps of 32 Fashion-MNIST images: val accuracy %.3f\n", acc);
  EXPECT_GT(acc, 0.5);
  out.clear();
  EXPECT_EQ(run_tessera("sample --checkpoint " + dir + "/checkpoints", &out), 1) << out;
  EXPECT_NE(out.find("an image classifier"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

// `train --model t5-tiny` on the shipped corpus learns to fill corrupted spans: the validation
// loss falls from about ln(50358) = 10.8 well below 8 in 200 steps; a T5 whose vocabulary lacks
// the sentinels is refused before training, and `sample` refuses a T5 checkpoint by name.
TEST(TesseraBinary, T5TinyLearnsSpanCorruption) {
  const std::string dir = ::testing::TempDir() + "/tessera_t5_run";
  std::filesystem::remove_all(dir);
  std::string out;
  EXPECT_EQ(run_tessera("train --model t5-small --steps 1 --out " + dir, &out), 1) << out;
  EXPECT_NE(out.find("sentinels"), std::string::npos) << out;
  out.clear();
  ASSERT_EQ(run_tessera("train --model t5-tiny --batch 8 --seq 64 --steps 200 --lr 3e-3 "
                        "--eval-every 0 --eval-batches 8 --out " +
                            dir,
                        &out),
            0)
      << out;
  const double val = last_val_loss(dir + "/metrics.jsonl");
  std::printf("t5-tiny, 200 steps of 8 x 64 corpus tokens: val loss %.3f\n", val);
  EXPECT_LT(val, 8.0);
  out.clear();
  EXPECT_EQ(run_tessera("sample --checkpoint " + dir + "/checkpoints", &out), 1) << out;
  EXPECT_NE(out.find("corrupted spans"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
