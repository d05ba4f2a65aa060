// A training run stopped by a signal, diverging, or started twice on one directory
// (train/run_control.h and the training loop): one clear message, a checkpoint that resumes,
// and never a non-finite one. And metrics.jsonl across runs (train/run_metrics.h): a resumed
// run records each step once, a new run never appends to an earlier run's records.
#include "train/run_control.h"

#include <gtest/gtest.h>
#include <unistd.h>

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
