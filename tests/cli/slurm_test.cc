// `tessera submit`, `jobs` and the requeue on a real Slurm (label slurm): a one-machine cluster
// (scripts/slurm_local.sh: munge, MariaDB + slurmdbd, slurmctld, slurmd) runs 2-task CPU jobs
// of gpt-tiny. A submitted job's losses equal `tessera launch -n 2` of the same plan; a job whose
// task is killed mid-run is requeued, resumes from its checkpoint and ends with the same
// losses; `tessera jobs` shows both with their runs, GPU-hours and cost as sacct accounts them.
// Skipped where Slurm cannot start (its packages missing, a daemon refused).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "cli/slurm_jobs.h"
#include "train_fixture.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// The cluster's folder: short, as munge's and MariaDB's sockets live in it.
std::string slurm_dir() { return "/tmp/tessera_slurm_" + std::to_string(::getpid()); }

class Slurm : public TrainDirTest {
 protected:
  static void SetUpTestSuite() {
    std::string log;
    start_rc_ = run_command(
        std::string(TESSERA_SOURCE_DIR) + "/scripts/slurm_local.sh start " + slurm_dir(), &log);
    start_log_ = log;
  }
  static void TearDownTestSuite() {
    std::string log;
    run_command(std::string(TESSERA_SOURCE_DIR) + "/scripts/slurm_local.sh stop " + slurm_dir(),
                &log);
    fs::remove_all(slurm_dir());
  }
  void SetUp() override {
    // Exit code 2: Slurm cannot start here (a package missing, a daemon refused); any other
    // failure is the script's.
    if (start_rc_ == 2) GTEST_SKIP() << "Slurm cannot start here:\n" << start_log_;
    ASSERT_EQ(start_rc_, 0) << "scripts/slurm_local.sh failed:\n" << start_log_;
    TrainDirTest::SetUp();
    // A flavor of 2 CPU cores at $36 an hour: a cent a second.
    std::ofstream(dir_ / "flavors.toml") << "[[flavor]]\nname = \"cpu.2\"\ncluster = "
                                            "\"cpu-local\"\ndevices = 2\nmemory_gb = 8\n"
                                            "price_per_hour = 36.0\n";
  }
  // A shell command run in the test's folder with Slurm's configuration and the test's jobs
  // registry.
  int sh(const std::string& cmd, std::string* out) {
    return run_command("cd " + dir_.string() + " && SLURM_CONF=" + slurm_dir() +
                           "/slurm.conf TESSERA_JOBS_FILE=" + (dir_ / "jobs.jsonl").string() +
                           " OMP_NUM_THREADS=1 " + cmd,
                       out);
  }
  std::string train_flags(const std::string& out) const {
    return "train --model gpt-tiny --device cpu --data " + (dir_ / "data").string() + " --out " +
           (dir_ / out).string() +
           " --seq 16 --batch 4 --steps 8 --warmup 1 --eval-every 0 --eval-batches 1 "
           "--ckpt-every 2 --sample-tokens 0 --comm-timeout 20";
  }
  // Submits the job; returns its id.
  // `train` (train_flags(out) when empty) with `env` set.
  std::string submit(const std::string& out, const std::string& env = "",
                     const std::string& train = "") {
    std::string log;
    EXPECT_EQ(sh(env + " " + TESSERA_BINARY + " submit --flavors flavors.toml --flavor cpu.2 -- " +
                     (train.empty() ? train_flags(out) : train),
                 &log),
              0)
        << log;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(log, m, std::regex("submitted job ([0-9]+)"))) << log;
    return m.size() > 1 ? m[1].str() : "";
  }
  // The job with rank 1 killed in step `step`, once.
  std::string submit_killed_in(const std::string& out, int step) {
    return submit(out, "TESSERA_FAULT_KILL_RANK=1 TESSERA_FAULT_KILL_STEP=" + std::to_string(step) +
                           " TESSERA_FAULT_KILL_ONCE=" + (dir_ / (out + ".once")).string());
  }
  // sacct's records of a job (-D: every run), "STATE|ELAPSED" each.
  std::vector<std::string> runs(const std::string& id) {
    std::string said;
    sh("sacct -X -D --noheader --parsable2 --format=State,Elapsed -j " + id, &said);
    std::vector<std::string> lines;
    std::istringstream in(said);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) lines.push_back(line);
    return lines;
  }
  // Waits (at most 5 minutes) for the job to leave the queue; returns its last state.
  std::string wait_for(const std::string& id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    while (std::chrono::steady_clock::now() < deadline) {
      std::string queued;
      sh("squeue -h -j " + id + " -o %t", &queued);
      const std::vector<std::string> r = runs(id);
      if (queued.find_first_not_of(" \n") == std::string::npos && !r.empty() &&
          r.back().rfind("REQUEUED", 0) != 0 && r.back().rfind("RUNNING", 0) != 0 &&
          r.back().rfind("PENDING", 0) != 0)
        return r.back().substr(0, r.back().find('|'));
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    return "TIMEOUT";
  }
  std::string slurm_log(const std::string& out, const std::string& id) {
    std::ifstream f(dir_ / out / ("slurm-" + id + ".out"));
    return std::string((std::istreambuf_iterator<char>(f)), {});
  }
  // `tessera launch -n 2` of the job's own train command (the plan and the step's split the
  // batch script passes), writing to `out`.
  int launch_like(const std::string& submitted, const std::string& out, std::string* log) {
    std::ifstream f(dir_ / submitted / "job.sbatch");
    const std::string script((std::istreambuf_iterator<char>(f)), {});
    std::smatch m;
    EXPECT_TRUE(
        std::regex_search(script, m, std::regex("--batch ([0-9]+) --grad-accum ([0-9]+) --plan ")))
        << script;
    return sh(std::string(TESSERA_BINARY) + " launch -n 2 -- " +
                  std::regex_replace(train_flags(out), std::regex("--batch 4"),
                                     "--batch " + m[1].str() + " --grad-accum " + m[2].str()) +
                  " --plan " + (dir_ / submitted / "plan.json").string(),
              log);
  }
  static inline int start_rc_ = -1;
  static inline std::string start_log_;
};

void expect_same_losses(const fs::path& want, const fs::path& got) {
  const std::vector<std::string> a = metric_losses(want), b = metric_losses(got);
  ASSERT_EQ(a.size(), 8u) << want;
  ASSERT_EQ(b.size(), 8u) << got << ": each step recorded once";
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i;
}

TEST_F(Slurm, SubmittedJobsTrainAsLaunchDoesAndARequeuedOneResumes) {
  // A job that runs through.
  const std::string plain = submit("plain");
  ASSERT_FALSE(plain.empty());
  ASSERT_EQ(wait_for(plain), "COMPLETED") << slurm_log("plain", plain);
  std::string log;
  ASSERT_EQ(launch_like("plain", "launched", &log), 0) << log;
  expect_same_losses(dir_ / "launched/metrics.jsonl", dir_ / "plain/metrics.jsonl");

  // Rank 1 is killed in step 5 (once): the batch script requeues the job, which resumes from
  // the checkpoint of step 4.
  const std::string killed = submit_killed_in("killed", 5);
  ASSERT_FALSE(killed.empty());
  ASSERT_EQ(wait_for(killed), "COMPLETED") << slurm_log("killed", killed);
  const std::string said = slurm_log("killed", killed);
  EXPECT_NE(said.find("killed by TESSERA_FAULT_KILL"), std::string::npos) << said;
  EXPECT_NE(said.find("ended with exit code 137 (a rank died); requeued (restart 1 of at most 3)"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("resumed from step 4 (the run before reached step 5: 1 step redone)"),
            std::string::npos)
      << said;
  expect_same_losses(dir_ / "launched/metrics.jsonl", dir_ / "killed/metrics.jsonl");
  const std::vector<std::string> killed_runs = runs(killed);
  ASSERT_EQ(killed_runs.size(), 2u);
  EXPECT_EQ(killed_runs[0].rfind("REQUEUED|", 0), 0u) << killed_runs[0];

  // Killed before the first checkpoint: the requeued job starts over, the lost run's records
  // kept aside, and ends with the same losses.
  const std::string early = submit_killed_in("early", 1);
  ASSERT_FALSE(early.empty());
  ASSERT_EQ(wait_for(early), "COMPLETED") << slurm_log("early", early);
  expect_same_losses(dir_ / "launched/metrics.jsonl", dir_ / "early/metrics.jsonl");
  EXPECT_TRUE(fs::exists(dir_ / "early/metrics.jsonl.lost-run-1")) << slurm_log("early", early);

  // tessera jobs: both, each with its runs, and the GPU-hours and cost of sacct's elapsed time
  // (every run) x 2 devices at $36 an hour.
  ASSERT_EQ(sh(std::string(TESSERA_BINARY) + " jobs", &log), 0) << log;
  for (const auto& [id, n] : {std::pair{plain, 1}, std::pair{killed, 2}}) {
    double seconds = 0;
    for (const std::string& r : runs(id))
      seconds += slurm_elapsed_seconds(r.substr(r.find('|') + 1));
    char want[160];
    std::snprintf(want, sizeof want, "cpu.2          COMPLETED   %4d %6d", n, 8);
    const size_t at = log.find("\n" + id + " ");
    ASSERT_NE(at, std::string::npos) << log;
    const std::string row = log.substr(at + 1, log.find('\n', at + 1) - at - 1);
    EXPECT_NE(row.find(want), std::string::npos) << row;
    char money[80];
    std::snprintf(money, sizeof money, " %12.4f %10.4f ", seconds / 3600 * 2, seconds / 100);
    EXPECT_NE(row.find(money), std::string::npos) << row << "\nwant" << money;
  }
  // The requeued job's report carries its cost.
  ASSERT_EQ(sh(std::string(TESSERA_BINARY) + " report killed", &log), 0) << log;
  EXPECT_NE(log.find("cost: job " + killed + " on cpu.2 (2 runs, COMPLETED): "), std::string::npos)
      << log;
}

// tessera cancel: the job's ranks get SIGTERM, finish their step and save a checkpoint; the job
// is not requeued, and `--resume` goes on from the checkpoint.
TEST_F(Slurm, CancelStopsAJobWithACheckpoint) {
  std::string log;
  const std::string id = submit("long", "",
                                std::regex_replace(train_flags("long"), std::regex("--steps 8"),
                                                   "--steps 100000 --log-every 1"));
  ASSERT_FALSE(id.empty());
  // Cancelled once it has trained a few steps.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  std::string queued = "R";
  while (last_training_record((dir_ / "long").string()).first < 3 &&
         queued.find_first_not_of(" \n") != std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    sh("squeue -h -j " + id + " -o %t", &queued);
  }
  ASSERT_EQ(sh(std::string(TESSERA_BINARY) + " cancel " + id, &log), 0) << log << "\n"
                                                                        << slurm_log("long", id);
  const std::string state = wait_for(id);
  const std::string said = slurm_log("long", id);
  EXPECT_NE(said.find("stopped by SIGTERM after step"), std::string::npos) << said;
  EXPECT_EQ(said.find("requeued"), std::string::npos) << said;
  EXPECT_EQ(runs(id).size(), 1u) << state;
  ASSERT_EQ(sh(std::string(TESSERA_BINARY) + " jobs", &log), 0) << log;
  EXPECT_NE(log.find("cpu.2          STOPPED        1 "), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(dir_ / "long/checkpoints/latest"));
  if (std::getenv("TESSERA_VERBOSE"))
    std::printf("cancelled job: %s\n%s", state.c_str(), said.c_str());
}

}  // namespace
}  // namespace tessera
