// `tessera launch -n N [--elastic [--min-ranks M]] -- train ...`: runs N ranks of this
// tessera binary on this machine through mpirun (--oversubscribe, so N may exceed the cores),
// forwarding the arguments. See launch_job.h for --elastic.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/launch_job.h"

namespace tessera {

namespace {

struct LaunchOptions {
  int ranks = 2;
  std::string mpirun = "mpirun";
  bool elastic = false;
  int min_ranks = 1;
  std::vector<std::string> args;
};

Status run_launch(const LaunchOptions& o) {
  if (o.ranks < 1) return error("-n must be at least 1");
  if (o.args.empty())
    return error("nothing to launch", "usage: tessera launch -n 4 -- train --zero 3");
  std::error_code ec;
  LaunchJob job;
  job.self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return error("cannot find the tessera binary (/proc/self/exe): " + ec.message());
  job.mpirun = o.mpirun;
  TS_RETURN_IF_ERROR(check_mpirun(job.mpirun));
  job.ranks = o.ranks;
  job.args = o.args;
  if (o.elastic) {
    TS_ASSIGN_OR_RETURN(int code, run_elastic(std::move(job), o.min_ranks));
    std::exit(code);
  }
  // `train`'s and `calibrate`'s flags are checked for N ranks in one process first: an
  // impossible plan or device is one error, not one per rank and mpirun's paragraph.
  if (o.args[0] == "train" || o.args[0] == "calibrate") {
    if (const int code = check_train_plan(job, /*quiet=*/false); code != 0) std::exit(code);
  }
  int stopped = 0;
  const int code = run_mpirun(job, &stopped);
  if (code < 0)
    return error("cannot run " + job.mpirun + ": " + std::strerror(errno),
                 "install Open MPI (scripts/install_deps.sh installs openmpi-bin)");
  std::exit(code);
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  CLI::App* cmd = app.add_subcommand("launch", "Run N ranks of a command on this machine (mpirun)");
  cmd->add_option("-n,--ranks", o->ranks, "Number of ranks")->capture_default_str();
  cmd->add_option("--mpirun", o->mpirun, "The MPI launcher")->capture_default_str();
  cmd->add_flag("--elastic", o->elastic,
                "When a rank dies, start the training run again on the ranks left, from its "
                "last checkpoint");
  CLI::Option* min_ranks =
      cmd->add_option("--min-ranks", o->min_ranks, "--elastic: the fewest ranks to go on with")
          ->capture_default_str();
  cmd->add_option("args", o->args, "The tessera command and its flags, after --");
  cmd->callback([o, min_ranks] {
    if (min_ranks->count() > 0 && !o->elastic)
      exit_on_error(
          error("--min-ranks applies to --elastic", "add --elastic, or drop --min-ranks"));
    exit_on_error(run_launch(*o));
  });
}

}  // namespace tessera
