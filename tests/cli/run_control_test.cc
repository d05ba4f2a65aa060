// A training run stopped by a signal, diverging, or started twice on one directory
// (train/run_control.h and the training loop): one clear message, a checkpoint that resumes,
// and never a non-finite one. And metrics.jsonl across runs (train/run_metrics.h): a resumed
// run records each step once, a new run never appends to an earlier run's records.
#include "train/run_control.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli/commands.h"
#include "io/fs.h"
#include "train/run_metrics.h"
#include "train_fixture.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class RunControlTest : public TrainDirTest {
 protected:
  TrainOptions options() const {
    TrainOptions o = tiny_options("run");
    o.steps = 6;
    o.warmup = 1;
    o.eval_every = 0;
    o.eval_batches = 1;
    o.ckpt_every = 1;
    return o;
  }
  std::string flags() const {
    return "--model gpt-tiny --data " + (dir_ / "data").string() + " --out " +
           (dir_ / "run").string() + " --batch 2 --seq 16 --eval-every 0 --sample-tokens 0";
  }
};

// An update that overflows the parameters stops the run before anything non-finite is saved.
TEST_F(RunControlTest, DivergenceStopsWithoutSavingNonFiniteState) {
  TrainOptions o = options();
  o.lr = 1e300;
  Status s = run_train(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("step 1: the parameters after the update went non-finite"),
            std::string::npos)
      << s.to_string();
  // Clipping at 1 (the default) is on: the hint suggests only the learning rate.
  EXPECT_NE(s.hint().find("try a lower --lr (now 1e+300)"), std::string::npos) << s.to_string();
  EXPECT_EQ(s.hint().find("--clip"), std::string::npos) << s.to_string();
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoints/latest"));
  o.clip = 0;  // without clipping, clipping is suggested too
  o.out = (dir_ / "unclipped").string();
  s = run_train(o);
  EXPECT_NE(s.hint().find("or --clip 1.0"), std::string::npos) << s.to_string();
}

// A second run on a directory in use: one error naming the holder's pid, nothing written.
TEST_F(RunControlTest, SecondRunOnALockedDirectoryNamesTheHolder) {
  fs::create_directories(dir_ / "run");
  Result<RunDirLock> held = RunDirLock::acquire((dir_ / "run").string());
  ASSERT_TRUE(held.ok()) << held.status().to_string();
  Status s = run_train(options());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(
      s.message().find("is in use by another tessera run (pid " + std::to_string(::getpid()) + ")"),
      std::string::npos)
      << s.to_string();
  EXPECT_FALSE(fs::exists(dir_ / "run/metrics.jsonl"));
}

// The same under launch: rank 0's lock error, once, at once; rank 1 neither waits for the
// --comm-timeout nor blames rank 0 (it waited in the communicator split until the timeout, and
// the error was lost: bad-inputs-7d08d5e N1). And an error every rank finds (a --data that is
// not there) is printed once, not once per rank (N8).
TEST_F(RunControlTest, RankErrorsAtStartUpArePrintedOnceAndAtOnce) {
  fs::create_directories(dir_ / "run");
  Result<RunDirLock> held = RunDirLock::acquire((dir_ / "run").string());
  ASSERT_TRUE(held.ok()) << held.status().to_string();
  auto count = [](const std::string& s, const std::string& what) {
    int n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
  };
  const std::string launch =
      "timeout 100 " + std::string(TESSERA_BINARY) + " launch -n 2 -- train ";
  std::string out;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(run_command(launch + flags() + " --steps 2 --comm-timeout 60", &out), 1) << out;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 30.0) << "the job waited for --comm-timeout (60 s)\n" << out;
  EXPECT_EQ(count(out, "is in use by another tessera run (pid " + std::to_string(::getpid()) + ")"),
            1)
      << out;
  EXPECT_EQ(out.find("timed out"), std::string::npos) << out;
  EXPECT_EQ(out.find("could not start"), std::string::npos) << out;  // the others stay quiet
  EXPECT_FALSE(fs::exists(dir_ / "run/metrics.jsonl"));

  const std::string nodata = "--model gpt-tiny --data " + (dir_ / "nodata").string() + " --out " +
                             (dir_ / "other").string() +
                             " --batch 2 --seq 16 --eval-every 0 --sample-tokens 0 --steps 2";
  EXPECT_EQ(run_command(launch + nodata, &out), 1) << out;
  EXPECT_EQ(count(out, "error: data path '" + (dir_ / "nodata").string() + "' does not exist"), 1)
      << out;
}

// A stop under launch: SIGTERM to launch, or Ctrl-C to its process group (a terminal's), while
// a step with a long evaluation runs: the ranks finish that step (the evaluation included) and
// save its checkpoint, then exit 143 / 130. mpirun used to kill them about 2 s after the signal,
// so nothing was saved of a step longer than that (bad-inputs-7d08d5e N2), and a signal during
// an evaluation stopped a step later (N9).
TEST_F(RunControlTest, StopsUnderLaunchFinishTheStepAndSave) {
  const std::pair<const char*, const char*> cases[] = {{"TERM", "143"}, {"INT", "130"}};
  for (const auto& [sig, code] : cases) {
    SCOPED_TRACE(sig);
    const std::string run = (dir_ / (std::string("run_") + sig)).string();
    const std::string flags = "--model gpt-tiny --data " + (dir_ / "data").string() + " --out " +
                              run +
                              " --batch 2 --seq 16 --steps 6 --eval-every 1 --eval-batches 1500 "
                              "--ckpt-every 1 --sample-tokens 0";
    // setsid: launch leads a process group of its own, as a shell's foreground job does; the
    // signal goes to that whole group (TERM as a scheduler would send it to launch alone).
    const std::string target = std::string(sig) == "INT" ? "-$pid" : "$pid";
    const std::string cmd = "setsid " + std::string(TESSERA_BINARY) + " launch -n 2 -- train " +
                            flags + " > " + run + ".log 2>&1 & pid=$!; " +
                            "while ! grep -q \"step 1: checkpoint saved\" " + run +
                            ".log 2>/dev/null; do sleep 0.05; done; kill -" + sig + " -- " +
                            target + "; wait $pid; echo \"exit=$?\"; cat " + run + ".log";
    std::string out;
    ASSERT_EQ(run_command("bash -c '" + cmd + "'", &out), 0) << out;
    EXPECT_NE(out.find(std::string("exit=") + code), std::string::npos) << out;
    EXPECT_NE(out.find(std::string("stopped by SIG") + sig + " after step 2, checkpoint saved"),
              std::string::npos)
        << out;
    std::ifstream latest(run + "/checkpoints/latest");
    std::string named;
    latest >> named;
    EXPECT_EQ(named, "step-00000002") << out;
    EXPECT_EQ(out.find("probably died"), std::string::npos) << out;
  }
}

// Staging directories a killed run left behind go; complete checkpoints stay.
TEST_F(RunControlTest, StaleStagingDirectoriesAreRemovedOnTheNextStart) {
  const fs::path stale = dir_ / "run/checkpoints/.tmp-step-00000003-4242-0";
  fs::create_directories(stale);
  std::ofstream(stale / "model.safetensors") << "half written";
  TrainOptions o = options();
  o.steps = 2;
  Status s = run_train(o);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step-00000002"));
}

// SIGTERM: the step finishes, a checkpoint is saved, exit 143 with a line on resuming; the
// run then resumes from that checkpoint.
TEST_F(RunControlTest, SigtermSavesACheckpointAndExits143) {
  const std::string run = (dir_ / "run").string();
  const std::string cmd = std::string(TESSERA_BINARY) + " train " + flags() +
                          " --steps 1000000 --ckpt-every 0 & pid=$!; "
                          "while [ ! -s " +
                          run +
                          "/metrics.jsonl ]; do sleep 0.05; done; "
                          "kill -TERM $pid; wait $pid; echo \"exit=$?\"";
  std::string out;
  ASSERT_EQ(run_command("sh -c '" + cmd + "'", &out), 0) << out;
  EXPECT_NE(out.find("exit=143"), std::string::npos) << out;
  EXPECT_NE(out.find("stopped by SIGTERM after step"), std::string::npos) << out;
  ASSERT_TRUE(fs::exists(dir_ / "run/checkpoints/latest")) << out;
  EXPECT_EQ(run_command(std::string(TESSERA_BINARY) + " train " + flags() +
                            " --steps 1000000 --resume --stop-after 1",
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("resumed from step"), std::string::npos) << out;
}

// A resumed run drops the records of the steps its checkpoint does not hold (they are redone)
// and a cut-off last line; other lines stay as they were.
TEST_F(RunControlTest, ResumeDropsRecordsAfterTheCheckpointAndACutOffLine) {
  const fs::path run = dir_ / "run";
  fs::create_directories(run);
  std::ofstream(run / "metrics.jsonl") << "{\"step\": 0, \"loss\": 4.5}\n"
                                       << "{\"step\": 1, \"loss\": 4.25}\n"
                                       << "{\"step\": 1, \"val_loss\": 4.5}\n"
                                       << "{\"note\": \"kept\"}\n"
                                       << "{\"step\": 2, \"loss\": 4.0}\n"
                                       << "{\"step\": 3, \"lo";
  EXPECT_EQ(last_recorded_step(run.string()), 2);
  Result<std::ofstream> m = open_run_metrics(run.string(), /*resume=*/true, /*start_step=*/2);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  *m << "{\"step\": 2, \"loss\": 3.9}\n";
  m->close();
  Result<std::string> text = read_file((run / "metrics.jsonl").string());
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(
      *text,
      "{\"step\": 0, \"loss\": 4.5}\n{\"step\": 1, \"loss\": 4.25}\n"
      "{\"step\": 1, \"val_loss\": 4.5}\n{\"note\": \"kept\"}\n{\"step\": 2, \"loss\": 3.9}\n");
  EXPECT_EQ(last_recorded_step((dir_ / "nowhere").string()), -1);
}

// A new run in a directory whose metrics.jsonl holds an earlier run's records (that run saved
// no checkpoint): refused, the records kept; an empty file is no earlier run.
TEST_F(RunControlTest, NewRunRefusesAnEarlierRunsRecords) {
  fs::create_directories(dir_ / "run");
  const std::string earlier = "{\"step\": 0, \"loss\": 10.5}\n";
  std::ofstream(dir_ / "run/metrics.jsonl") << earlier;
  TrainOptions o = options();
  o.steps = 1;
  Status s = run_train(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("holds metrics.jsonl of an earlier run that saved no checkpoint"),
            std::string::npos)
      << s.to_string();
  EXPECT_NE(s.hint().find("choose another --out"), std::string::npos) << s.to_string();
  EXPECT_EQ(*read_file((dir_ / "run/metrics.jsonl").string()), earlier);
  std::ofstream(dir_ / "run/metrics.jsonl", std::ios::trunc).close();
  s = run_train(o);
  EXPECT_TRUE(s.ok()) << s.to_string();
}

// --resume needs a checkpoint in --out, and steps left to take; a hand-edited manifest's step
// and optimizer count are range-checked. Each is one error, and nothing is trained.
TEST_F(RunControlTest, ResumeRefusesNothingToResumeNoStepsLeftAndAnEditedStep) {
  TrainOptions o = options();
  o.resume = true;
  Status s = run_train(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("holds no checkpoint to continue from"), std::string::npos)
      << s.to_string();
  EXPECT_FALSE(fs::exists(dir_ / "run"));
  o.resume = false;
  o.steps = 2;
  ASSERT_TRUE(run_train(o).ok());
  o.resume = true;
  s = run_train(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--steps 2: the run in '" + o.out + "' has already taken 2 steps"),
            std::string::npos)
      << s.to_string();
  const fs::path manifest = dir_ / "run/checkpoints/step-00000002/manifest.json";
  Result<std::string> text = read_file(manifest.string());
  ASSERT_TRUE(text.ok());
  const size_t at = text->find("\"step\": 2");
  ASSERT_NE(at, std::string::npos) << *text;
  std::ofstream(manifest) << text->substr(0, at) << "\"step\": -7" << text->substr(at + 9);
  o.steps = 6;
  s = run_train(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("step -7 and optimizer.t 2 are not a training state"),
            std::string::npos)
      << s.to_string();
}

}  // namespace
}  // namespace tessera
