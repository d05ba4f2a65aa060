// A rank that dies mid-run must not hang the job: runs `mpirun -np 3 comm_mpi_test kill`
// (rank 1 raises SIGKILL just before an all_reduce the others enter) and checks that mpirun
// exits non-zero within 60 s and that a surviving rank's output names the operation it was
// blocked in: the termination reporter's line (Open MPI sends SIGTERM to the survivors), or,
// should the launcher not kill them, the timeout error. Also a rank that hangs instead
// (`stuck`): the others must time out. And both in a pipeline's point-to-point receives.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

struct Outcome {
  int exit_code = -1;
  double seconds = 0;
  std::string output;
};

Outcome run_command(const std::string& command) {
  Outcome run;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return run;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) run.output.append(buf, n);
  const int status = pclose(pipe);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

Outcome run_scenario(const std::string& scenario) {
  const std::string command = std::string("timeout 90 ") + TESSERA_MPIEXEC +
                              " --oversubscribe --allow-run-as-root -np 3 " +
                              TESSERA_COMM_MPI_TEST + " " + scenario;
  Outcome run = run_command(command);
  std::printf("%s\n-> exit code %d after %.1f s; output:\n%s\n", command.c_str(), run.exit_code,
              run.seconds, run.output.c_str());
  return run;
}

TEST(CommMpiKill, JobEndsAndSurvivorNamesTheOperation) {
  Outcome run = run_scenario("kill");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.exit_code, 124) << "the job hung until `timeout 90` ended it";
  const bool reported =
      contains(run.output, "got a termination signal while waiting in all_reduce 'doomed'") ||
      (contains(run.output, "timed out after") && contains(run.output, "'doomed'"));
  EXPECT_TRUE(reported) << "no surviving rank named the operation it was waiting in";
  // Someone names the dead rank: a survivor (rank 2 waits for rank 1) or the launcher.
  EXPECT_TRUE(contains(run.output, "from rank 1") || contains(run.output, "process rank 1"));
}

// Rank 1 hangs instead of dying: the launcher sees nothing wrong, so the survivors' 2 s
// timeout must fire, name rank 1, and end the job.
TEST(CommMpiKill, StuckRankMakesOthersTimeOut) {
  Outcome run = run_scenario("stuck");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.exit_code, 124) << "the job hung until `timeout 90` ended it";
  EXPECT_TRUE(contains(
      run.output, "rank 2: timed out after 2.0 s in all_reduce 'doomed' (axis world, 3 ranks"));
  EXPECT_TRUE(contains(run.output, "waiting for data from rank 1"));
  EXPECT_TRUE(contains(run.output, "HINT: rank 1 died or is stuck"));
}

// The same in the MPI library's collective (CollectiveAlgo::mpi): no peer is known, so the
// survivors name the operation, the axis and the ranks they wait with.
TEST(CommMpiKill, DeadRankEndsTheJobInAnMpiCollective) {
  Outcome run = run_scenario("kill_mpi");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.exit_code, 124) << "the job hung until `timeout 90` ended it";
  const bool reported =
      contains(run.output,
               "got a termination signal while waiting in all_reduce 'doomed' (axis world, the "
               "MPI library's collective)") ||
      (contains(run.output, "timed out after") && contains(run.output, "'doomed'"));
  EXPECT_TRUE(reported) << "no surviving rank named the operation it was waiting in";
}

TEST(CommMpiKill, StuckRankMakesOthersTimeOutInAnMpiCollective) {
  Outcome run = run_scenario("stuck_mpi");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.exit_code, 124) << "the job hung until `timeout 90` ended it";
  EXPECT_TRUE(contains(
      run.output, "rank 2: timed out after 2.0 s in all_reduce 'doomed' (axis world, 3 ranks"));
  EXPECT_TRUE(contains(run.output, "waiting in the MPI library's collective with ranks 0, 1"));
  EXPECT_TRUE(contains(run.output, "HINT: one of them died or is stuck"));
}

// Mid-pipeline: rank 1 (the middle stage) dies; a survivor names the recv it was in. Either
// survivor may speak first: rank 2 waits for activations, rank 0 (on a loaded machine already
// past its forward pass) for the gradients of chunk 0.
TEST(CommMpiKill, DeadStageIsNamedByThePipelineRecv) {
  Outcome run = run_scenario("pipe_kill");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.exit_code, 124) << "the job hung until `timeout 90` ended it";
  const bool reported =
      contains(run.output,
               "got a termination signal while waiting in recv 'activations into chunk 2, "
               "micro-batch 0' (axis world) for data from rank 1") ||
      contains(run.output,
               "got a termination signal while waiting in recv 'gradients into chunk 0, "
               "micro-batch 0' (axis world) for data from rank 1") ||
      contains(run.output,
               "recv 'activations into chunk 2, micro-batch 0' (axis world, 256.00 "
               "KiB) from rank 1 timed out");
  EXPECT_TRUE(reported) << "no surviving stage named the recv it was waiting in";
}

TEST(CommMpiKill, StuckStageMakesThePipelineTimeOut) {
  Outcome run = run_scenario("pipe_stuck");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.exit_code, 124) << "the job hung until `timeout 90` ended it";
  EXPECT_TRUE(contains(run.output,
                       "rank 2: recv 'activations into chunk 2, micro-batch 0' (axis world, "
                       "256.00 KiB) from rank 1 timed out after 2.0 s"));
  EXPECT_TRUE(contains(run.output, "HINT: rank 1 died or is stuck"));
}

}  // namespace
