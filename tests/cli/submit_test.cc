// `tessera submit`: a training run planned for a flavor's GPUs as a Slurm batch script. The
// script's content (--dry-run), the errors (an unknown or too small flavor, no Slurm, sbatch
// refusing), and a submission through a stand-in sbatch (Slurm itself is not run here).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "train_fixture.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class Submit : public TrainDirTest {
 protected:
  std::string tessera(const std::string& args, int want_rc) {
    std::string out;
    // The jobs registry in the test's directory, not the user's home.
    EXPECT_EQ(run_command("cd " + dir_.string() + " && TESSERA_JOBS_FILE=" +
                              (dir_ / "jobs.jsonl").string() + " " + TESSERA_BINARY + " " + args,
                          &out),
              want_rc)
        << args << "\n"
        << out;
    return out;
  }
  // An executable script `name` in <dir>/bin printing `said` and exiting `rc`.
  std::string fake(const std::string& name, const std::string& said, int rc) {
    fs::create_directories(dir_ / "bin");
    const fs::path p = dir_ / "bin" / name;
    std::ofstream(p) << "#!/bin/sh\necho \"$@\" > " << (dir_ / (name + ".args")).string()
                     << "\necho '" << said << "'\nexit " << rc << "\n";
    ::chmod(p.c_str(), 0755);
    return p.string();
  }
};

// One node of 8 H100s (xlarge.640gb): the plan for the model, and a script asking Slurm for one
// node of 8 tasks with a GPU each, with a time limit from the prediction, SIGTERM before it
// (the graceful checkpoint) and a requeue that resumes.
TEST_F(Submit, DryRunPrintsThePlanAndTheBatchScript) {
  const std::string out = tessera(
      "submit --flavor xlarge.640gb --dry-run -- train --model llama3-8b --batch 64 --seq 2048 "
      "--steps 1000 --precision bf16 --out run",
      0);
  for (const char* want :
       {"\"mesh\"", "#SBATCH --nodes=1\n", "#SBATCH --ntasks-per-node=8\n",
        "#SBATCH --gpus-per-task=1\n", "#SBATCH --time=0-", "#SBATCH --signal=TERM@120\n",
        "#SBATCH --requeue\n", " --plan ", "/run/plan.json", " --device cuda", "--precision bf16",
        "8 x H100-SXM5-80GB, predicted", "resume=--resume"})
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
  // The step's split is the plan's: the user's --batch 64 is not passed on twice.
  EXPECT_EQ(out.find("--batch 64"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir_ / "run")) << "a dry run writes nothing";
  // A task that dies requeues the job (at most --max-requeues times), which resumes.
  for (const char* want :
       {"srun --kill-on-bad-exit=1 ", "[ -e ", "/run/checkpoints/latest ] && resume=--resume\n",
        "\"$runs\" -lt 3 ]", "scontrol requeue \"$SLURM_JOB_ID\""})
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
  // A CPU job asks Slurm for no GPUs.
  const std::string cpu = tessera(
      "submit --gpus 2 --cluster cpu-local --max-requeues 1 --dry-run -- train --model gpt-tiny "
      "--seq 16 --device cpu",
      0);
  EXPECT_EQ(cpu.find("--gpus-per-task"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("\"$runs\" -lt 1 ]"), std::string::npos) << cpu;
  EXPECT_EQ(cpu.find("--device cuda"), std::string::npos) << cpu;
  // Two nodes for 16 devices.
  const std::string two =
      tessera("submit --flavor 2xlarge.1280gb --dry-run -- train --model gpt-tiny --seq 16", 0);
  EXPECT_NE(two.find("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\n"), std::string::npos) << two;
  // The log's path as Slurm reads it: a '%' in --out doubled (else a filename pattern), and a
  // space (which no #SBATCH quoting carries) refused by name.
  const std::string job = " --dry-run -- train --model gpt-tiny --seq 16 --device cpu --out ";
  const std::string pct = tessera("submit --gpus 2 --cluster cpu-local" + job + "run%1", 0);
  EXPECT_NE(pct.find("/run%%1/slurm-%j.out\n"), std::string::npos) << pct;
  EXPECT_NE(pct.find("/run%1/plan.json"), std::string::npos) << pct;
  const std::string space = tessera("submit --gpus 2 --cluster cpu-local" + job + "'my run'", 1);
  EXPECT_NE(space.find("error: --out '"), std::string::npos) << space;
  EXPECT_NE(space.find("#SBATCH --output line does not quote"), std::string::npos) << space;
}

TEST_F(Submit, BadFlavorsAndNoSlurmAreOneError) {
  const std::string job = " -- train --model gpt-tiny --seq 16 --out run";
  std::string out = tessera("submit --flavor xlarge --dry-run" + job, 1);
  EXPECT_NE(out.find("--flavor 'xlarge' is not a flavor"), std::string::npos) << out;
  EXPECT_NE(out.find("small.80gb, medium.160gb"), std::string::npos) << out;
  out = tessera(
      "submit --flavor small.80gb --dry-run -- train --model llama3-70b --batch 64 --seq 2048 "
      "--precision bf16",
      1);
  EXPECT_NE(out.find("small.80gb cannot train llama3-70b"), std::string::npos) << out;
  EXPECT_NE(out.find("the smallest flavor that fits is"), std::string::npos) << out;
  out = tessera("submit --flavor small.80gb --sbatch no-such-sbatch" + job, 1);
  EXPECT_NE(out.find("no Slurm on this machine"), std::string::npos) << out;
  out = tessera("submit --flavor small.80gb --dry-run -- train --model gpt-tiny --tp 2", 1);
  EXPECT_NE(out.find("--tp: submit chooses the plan"), std::string::npos) << out;
  out = tessera("submit --dry-run" + job, 1);
  EXPECT_NE(out.find("needs --flavor NAME or --gpus N"), std::string::npos) << out;
  out = tessera("submit --flavor small.80gb --max-requeues -1 --dry-run" + job, 1);
  EXPECT_NE(out.find("--max-requeues must be >= 0, got -1"), std::string::npos) << out;
}

// Through a stand-in sbatch: the plan and the script are written into --out and the job id is
// printed; an sbatch that refuses is one error with its message.
TEST_F(Submit, SubmitsWithSbatchAndReportsItsRefusal) {
  const std::string ok = fake("sbatch", "Submitted batch job 4242", 0);
  std::string out = tessera("submit --flavor medium.160gb --sbatch " + ok +
                                " -- train --model gpt-tiny --seq 16 --steps 10 --out run",
                            0);
  EXPECT_NE(out.find("submitted job 4242"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(dir_ / "run/plan.json"));
  std::ifstream script(dir_ / "run/job.sbatch");
  const std::string text((std::istreambuf_iterator<char>(script)), {});
  EXPECT_NE(text.find("#SBATCH --ntasks-per-node=2"), std::string::npos) << text;
  std::ifstream args(dir_ / "sbatch.args");
  std::string passed;
  std::getline(args, passed);
  EXPECT_EQ(passed, (dir_ / "run/job.sbatch").string());
  const std::string refuses =
      fake("sbatch_no", "sbatch: error: Batch job submission failed: Invalid partition", 1);
  out = tessera("submit --flavor medium.160gb --sbatch " + refuses +
                    " -- train --model gpt-tiny --seq 16 --steps 10 --out run2",
                1);
  EXPECT_NE(out.find("sbatch refused the job (exit code 1): sbatch: error: Batch job submission "
                     "failed: Invalid partition"),
            std::string::npos)
      << out;
}

// `tessera jobs`: each submitted job with Slurm's state and elapsed time, its step and rate
// from metrics.jsonl, device-hours and cost at the flavor's price; `tessera cancel` asks Slurm
// to send the job's ranks SIGTERM (the graceful stop), for jobs submitted from here only.
TEST_F(Submit, JobsShowCostAndCancelStopsGracefully) {
  const std::string ok = fake("sbatch", "Submitted batch job 4242", 0);
  tessera("submit --flavor medium.160gb --sbatch " + ok +
              " -- train --model gpt-tiny --seq 16 --steps 10 --out run",
          0);
  std::ofstream(dir_ / "run/metrics.jsonl")
      << "{\"step\":8,\"loss\":9.0,\"lr\":0.001,\"tokens_per_s\":1500}\n"
      << "{\"step\":9,\"loss\":8.5,\"lr\":0.001,\"tokens_per_s\":2000}\n";
  // Requeued once: a run of 30 minutes, then one of an hour (sacct -D lists both).
  const std::string sacct = fake("sacct", "4242|REQUEUED|30:00\n4242|COMPLETED|01:00:00", 0);
  std::string out = tessera("jobs --sacct " + sacct, 0);
  // 1.5 h on medium.160gb: 2 H100s at dgx-h100's 12.29 per device-hour.
  EXPECT_NE(out.find("4242"), std::string::npos) << out;
  EXPECT_NE(out.find("COMPLETED      2 "), std::string::npos) << out;  // the last run's state
  EXPECT_NE(out.find("      3.0000    36.8700"), std::string::npos) << out;
  EXPECT_NE(out.find(" 10 "), std::string::npos) << out;  // steps reached
  // The run's report carries its cost.
  out = tessera("report run --sacct " + sacct, 0);
  EXPECT_NE(out.find("cost: job 4242 on medium.160gb (2 runs, COMPLETED): 3.0000 GPU-hours, "
                     "$36.8700, $"),
            std::string::npos)
      << out;
  std::ifstream page(dir_ / "run/report/index.html");
  const std::string html((std::istreambuf_iterator<char>(page)), {});
  EXPECT_NE(html.find("<p>cost: job 4242 on medium.160gb"), std::string::npos);
  const std::string scancel = fake("scancel", "", 0);
  out = tessera("cancel 4242 --scancel " + scancel, 0);
  EXPECT_NE(out.find("asked job 4242 to stop"), std::string::npos) << out;
  std::ifstream args(dir_ / "scancel.args");
  std::string passed;
  std::getline(args, passed);
  EXPECT_EQ(passed, "--signal=TERM 4242");
  out = tessera("cancel 999 --scancel " + scancel, 1);
  EXPECT_NE(out.find("job 999 was not submitted from here"), std::string::npos) << out;
}

// A user's flavors file adds to the ladder.
TEST_F(Submit, AUsersFlavorsFileAddsFlavors) {
  std::ofstream(dir_ / "mine.toml") << "[[flavor]]\nname = \"a100x4\"\ncluster = \"dgx-a100\"\n"
                                       "devices = 4\nmemory_gb = 320\n";
  const std::string out = tessera(
      "submit --flavors mine.toml --flavor a100x4 --dry-run -- train --model gpt-tiny --seq 16", 0);
  EXPECT_NE(out.find("4 x A100-SXM4-80GB"), std::string::npos) << out;
  EXPECT_NE(out.find("$20.48 per hour"), std::string::npos) << out;  // 4 x dgx-a100's 5.12
}

}  // namespace
}  // namespace tessera
