// `tessera launch -n N -- train ...`: runs N ranks of this tessera binary on this machine
// through mpirun (--oversubscribe, so N may exceed the cores), forwarding the arguments.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"

namespace tessera {

namespace {

struct LaunchOptions {
  int ranks = 2;
  std::string mpirun = "mpirun";
  std::vector<std::string> args;
};

// execvp(args[0], args); returns only on failure.
void exec_args(std::vector<std::string> args) {
  std::vector<char*> c;
  for (std::string& a : args) c.push_back(a.data());
  c.push_back(nullptr);
  execvp(c[0], c.data());
}

Status run_launch(const LaunchOptions& o) {
  if (o.ranks < 1) return error("-n must be at least 1");
  if (o.args.empty())
    return error("nothing to launch", "usage: tessera launch -n 4 -- train --zero 3");
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return error("cannot find the tessera binary (/proc/self/exe): " + ec.message());
  // `train`'s flags are checked for N ranks in one process first: an impossible plan is one
  // error, not one per rank and mpirun's paragraph.
  if (o.args[0] == "train") {
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) return error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      setenv("TESSERA_LAUNCH_CHECK", std::to_string(o.ranks).c_str(), 1);
      std::vector<std::string> args = {self};
      args.insert(args.end(), o.args.begin(), o.args.end());
      exec_args(std::move(args));
      _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) return error(std::string("waitpid: ") + std::strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      std::exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
  }
  std::vector<std::string> argv = {o.mpirun, "--oversubscribe", "-np", std::to_string(o.ranks)};
  if (geteuid() == 0) argv.insert(argv.begin() + 1, "--allow-run-as-root");
  argv.push_back(self);
  argv.insert(argv.end(), o.args.begin(), o.args.end());
  std::fflush(nullptr);
  exec_args(std::move(argv));
  return error("cannot run " + o.mpirun + ": " + std::strerror(errno),
               "install Open MPI (scripts/install_deps.sh installs openmpi-bin)");
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  CLI::App* cmd = app.add_subcommand("launch", "Run N ranks of a command on this machine (mpirun)");
  cmd->add_option("-n,--ranks", o->ranks, "Number of ranks")->capture_default_str();
  cmd->add_option("--mpirun", o->mpirun, "The MPI launcher")->capture_default_str();
  cmd->add_option("args", o->args, "The tessera command and its flags, after --")->required();
  cmd->callback([o] { exit_on_error(run_launch(*o)); });
}

}  // namespace tessera
