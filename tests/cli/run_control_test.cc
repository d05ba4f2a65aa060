// A training run stopped by a signal, diverging, or started twice on one directory
// (train/run_control.h and the training loop): one clear message, a checkpoint that resumes,
// and never a non-finite one.
#include "train/run_control.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli/commands.h"
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
  EXPECT_NE(s.hint().find("try a lower --lr (now 1e+300) or --clip 1.0"), std::string::npos)
      << s.to_string();
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoints/latest"));
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

}  // namespace
}  // namespace tessera
