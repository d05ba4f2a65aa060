#include "cli/launch_job.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/common.h"
#include "io/fs.h"
#include "io/sharded_checkpoint.h"
#include "train/run_metrics.h"

namespace tessera {

namespace {

std::atomic<pid_t> g_child{0};  // the running child, for on_launch_signal
std::atomic<int> g_stopped{0};  // the stop signal launch received, 0 if none
std::atomic<int> g_signals{0};  // stop signals received, forwarded by run_child's wait

// execvp(argv); returns only on failure.
void exec_argv(std::vector<std::string> argv) {
  std::vector<char*> c;
  for (std::string& a : argv) c.push_back(a.data());
  c.push_back(nullptr);
  execvp(c[0], c.data());
}

// mpirun --oversubscribe --stdin none -np RANKS this-binary ARGS... (mpirun runs in a process
// group of its own, so it must not read the terminal).
std::vector<std::string> mpirun_argv(const LaunchJob& job) {
  std::vector<std::string> argv = {job.mpirun, "--oversubscribe",        "--stdin", "none",
                                   "-np",      std::to_string(job.ranks)};
  if (geteuid() == 0) argv.insert(argv.begin() + 1, "--allow-run-as-root");
  argv.push_back(job.self);
  argv.insert(argv.end(), job.args.begin(), job.args.end());
  return argv;
}

// The processes whose parent is `parent` (/proc/PID/stat's fourth field).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const size_t close = line.rfind(')');  // the command name may hold spaces and parentheses
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    std::string state;
    long ppid = 0;
    if (rest >> state >> ppid && ppid == parent) out.push_back(std::stoi(name));
  }
  return out;
}

// A stop signal launch received, passed on to the ranks themselves (mpirun's children, as Open
// MPI starts a node's ranks): each finishes its step and saves the checkpoint at its own pace,
// where mpirun, signalled, would kill them about 2 s later. SIGTERM goes as SIGUSR1 and SIGINT
// as SIGUSR2, which a rank takes as that stop asked for by the user (train/run_control.h), not
// the SIGTERM mpirun sends when another rank died. Without ranks yet, mpirun gets the signal.
void forward_stop(pid_t mpirun, int sig) {
  const std::vector<pid_t> ranks = children_of(mpirun);
  if (ranks.empty()) {
    kill(mpirun, sig);
    return;
  }
  for (pid_t r : ranks) kill(r, sig == SIGINT ? SIGUSR2 : SIGUSR1);
}

// fork + execvp(argv); `env_name` is set in the child, `quiet` sends its output to /dev/null.
// With `own_group` the child runs in a process group of its own (a terminal's Ctrl-C reaches
// launch alone) and the stop signals launch receives meanwhile are forwarded (forward_stop).
// Returns the child's exit code, 128 + signal if a signal ended it, -1 if it could not start.
int run_child(std::vector<std::string> argv, const char* env_name, const std::string& env_value,
              bool quiet, bool own_group = false) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (own_group) setpgid(0, 0);
    if (env_name) setenv(env_name, env_value.c_str(), 1);
    if (quiet) {
      const int null = ::open("/dev/null", O_WRONLY);
      if (null >= 0) {
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
      }
    }
    const std::string program = argv[0];
    exec_argv(std::move(argv));
    std::fprintf(stderr, "error: cannot run %s: %s\n", program.c_str(), std::strerror(errno));
    _exit(127);
  }
  g_child = pid;
  int status = 0, forwarded = g_signals.load();
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
    for (; own_group && forwarded < g_signals.load(); ++forwarded) forward_stop(pid, g_stopped);
  }
  g_child = 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// SIGTERM (a scheduler's preemption) or SIGINT (Ctrl-C: mpirun and the ranks are in process
// groups of their own) reach launch alone: recorded here, passed on to the ranks by
// run_child's wait, which the signal interrupts.
extern "C" void on_launch_signal(int sig) {
  g_stopped = sig;
  ++g_signals;
}

// The step of the last complete checkpoint under OUT/checkpoints; -1 when there is none.
int64_t last_checkpoint_step(const std::string& out) {
  const std::string root = out + "/checkpoints";
  if (!path_exists(root + "/latest")) return -1;
  Result<ShardedCheckpoint> ck = ShardedCheckpoint::open(root);
  if (!ck.ok()) return -1;
  const nlohmann::json& m = ck->manifest();
  return m.contains("step") && m["step"].is_number_integer() ? m["step"].get<int64_t>() : -1;
}

}  // namespace

Status check_mpirun(const std::string& mpirun) {
  const int code = run_child({mpirun, "--version"}, nullptr, "", /*quiet=*/true);
  if (code == 0) return Status();
  return error("--mpirun " + mpirun + " is not an MPI launcher: `" + mpirun + " --version` " +
                   (code == 127 ? "could not run" : "exited with code " + std::to_string(code)),
               "pass Open MPI's mpirun (scripts/install_deps.sh installs openmpi-bin) or MPICH's "
               "mpiexec");
}

int check_train_plan(const LaunchJob& job, bool quiet) {
  std::vector<std::string> argv = {job.self};
  argv.insert(argv.end(), job.args.begin(), job.args.end());
  return run_child(std::move(argv), "TESSERA_LAUNCH_CHECK", std::to_string(job.ranks), quiet);
}

int run_mpirun(const LaunchJob& job, int* stopped) {
  struct sigaction sa {
  }, old_term{}, old_int{};
  sa.sa_handler = on_launch_signal;  // no SA_RESTART: the signal interrupts the wait
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGINT, &sa, &old_int);
  const int code = run_child(mpirun_argv(job), nullptr, "", false, /*own_group=*/true);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGINT, &old_int, nullptr);
  *stopped = g_stopped;
  return code;
}

Result<int> run_elastic(LaunchJob job, int min_ranks) {
  if (job.args.empty() || job.args[0] != "train")
    return error("--elastic restarts a training run; it cannot restart `" +
                     (job.args.empty() ? std::string() : job.args[0]) + "`",
                 "tessera launch -n 4 --elastic -- train --ckpt-every 50 ...");
  if (min_ranks < 1 || min_ranks > job.ranks)
    return error("--min-ranks " + std::to_string(min_ranks) + " must be between 1 and -n (" +
                 std::to_string(job.ranks) + ")");
  if (has_flag(job.args, "--plan"))
    return error(
        "--elastic plans the job again for the ranks left, from its flags; --plan "
        "fixes the plan (a file) or may split the batch differently (auto)",
        "give the plan as flags (--tp, --pp, --zero, --hsdp, ...) with --elastic");
  if (has_flag(job.args, "--dp")) {
    std::fprintf(stderr,
                 "tessera launch: --elastic drops --dp: the data-parallel degree follows the "
                 "ranks\n");
    job.args = without_flag(job.args, "--dp", true);
  }
  std::string out = flag_value(job.args, "--out");
  if (out.empty()) out = "runs/default";

  // The first job runs on the ranks asked for, as without --elastic.
  if (const int code = check_train_plan(job, /*quiet=*/false); code != 0) return code;
  int restarts = 0;
  int64_t redone = 0;
  for (int ranks = job.ranks;;) {
    // The most ranks (down to --min-ranks) the flags make a plan for.
    LaunchJob attempt = job;
    for (attempt.ranks = ranks; attempt.ranks >= min_ranks; --attempt.ranks)
      if (restarts == 0 || check_train_plan(attempt, /*quiet=*/true) == 0) break;
    if (attempt.ranks < min_ranks) {
      attempt.ranks = ranks;
      check_train_plan(attempt, /*quiet=*/false);  // prints why, for `ranks`
      return error("no plan for " + std::to_string(min_ranks) + " to " + std::to_string(ranks) +
                       " ranks with these flags",
                   min_ranks > 1 ? "lower --min-ranks, or use flags that fit fewer ranks"
                                 : "use flags that fit fewer ranks (the error above says which "
                                   "flag needs more), then resume with --resume");
    }
    if (attempt.ranks < ranks)
      std::fprintf(stderr, "tessera launch: the plan fits %d of the %d ranks left; %d idle\n",
                   attempt.ranks, ranks, ranks - attempt.ranks);
    int stopped = 0;
    const int code = run_mpirun(attempt, &stopped);
    if (code < 0) return error("cannot run " + job.mpirun + ": " + std::strerror(errno));
    if (code == 0) {
      if (restarts > 0)
        std::fprintf(stderr,
                     "tessera launch: the run finished after %d restart%s; %lld step%s redone\n",
                     restarts, restarts == 1 ? "" : "s", (long long)redone, redone == 1 ? "" : "s");
      return 0;
    }
    // Stopped on purpose (the ranks saved a checkpoint; mpirun itself exits 1 then), or an
    // error the job printed: starting again would not help.
    if (stopped != 0) return 128 + stopped;
    if (code < 128) return code;
    const int64_t reached = last_recorded_step(out) + 1;  // steps the lost job finished
    const int64_t saved = last_checkpoint_step(out);
    ranks = attempt.ranks - 1;
    std::fprintf(stderr,
                 "tessera launch: the job on %d ranks ended with exit code %d (a rank died) after "
                 "step %lld\n",
                 attempt.ranks, code, (long long)reached);
    if (ranks < min_ranks)
      return error(std::to_string(ranks) + " rank" + (ranks == 1 ? "" : "s") +
                       " left, fewer than --min-ranks " + std::to_string(min_ranks),
                   "resume the run later with `tessera launch -n N -- train ... --resume`");
    if (saved >= 0) {
      if (!has_flag(job.args, "--resume")) {
        job.args = without_flag(job.args, "--init-from", true);  // the checkpoint holds it now
        job.args.push_back("--resume");
      }
    } else if (path_exists(out + "/metrics.jsonl")) {
      // No checkpoint yet: the records are the lost job's own (a new run refuses a directory
      // with earlier records), and it starts over.
      std::remove((out + "/metrics.jsonl").c_str());
    }
    const int64_t from = std::max<int64_t>(saved, 0);
    redone += std::max<int64_t>(reached - from, 0);
    std::fprintf(stderr, "tessera launch: restarting on %d ranks from %s: %lld step%s redone\n",
                 ranks,
                 saved >= 0 ? ("the checkpoint of step " + std::to_string(saved)).c_str()
                            : "step 0 (no checkpoint yet)",
                 (long long)std::max<int64_t>(reached - from, 0), reached - from == 1 ? "" : "s");
    ++restarts;
  }
}

}  // namespace tessera
