// tessera: train, inspect and sample transformer models written once for one device.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "io/toml_config.h"

int main(int argc, char** argv) {
  // OpenBLAS picks its kernels when it is loaded: if it fell back to the slow generic ones on
  // this CPU, start again with the fast ones named (5-7x faster GEMMs on AVX-512 Xeons).
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    if (const char* core = tessera::openblas_better_coretype()) {
      setenv("OPENBLAS_CORETYPE", core, 1);
      execv("/proc/self/exe", argv);  // returns only on failure: carry on with slow kernels
    }
  }
  CLI::App app{
      "Tessera: train transformer models written once for one device.\n"
      "Run `tessera COMMAND --help` for a command's flags."};
  app.require_subcommand(1);
  tessera::TrainOptions train;
  tessera::add_train_command(app, train);
  tessera::add_graph_command(app);
  tessera::add_plan_command(app);
  tessera::add_simulate_command(app);
  tessera::add_validate_command(app);
  tessera::add_calibrate_command(app);
  tessera::add_launch_command(app);
  tessera::add_sample_command(app);
  tessera::add_tokenize_command(app);
  tessera::add_hf_commands(app);
  tessera::add_report_command(app);
  tessera::add_submit_command(app);
  tessera::add_jobs_commands(app);
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION);
  std::vector<std::string> names;  // the commands
  for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
  // `tessera help` is --help; a mistyped command is named, with the nearest one.
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string command = argv[1];
    if (command == "help") {
      std::fputs(app.help().c_str(), stdout);
      return 0;
    }
    auto unknown = [&](const std::string& name) {
      if (std::find(names.begin(), names.end(), name) != names.end()) return false;
      const std::string near = tessera::closest_match(name, names);
      std::fprintf(stderr, "error: unknown command '%s'%s\nHINT: the commands: %s\n", name.c_str(),
                   near.empty() ? "" : (" (did you mean " + near + "?)").c_str(),
                   tessera::join_strings(names).c_str());
      return true;
    };
    if (unknown(command)) return 2;
    // `launch -- COMMAND`: named here once, not by every rank it would start.
    if (command == "launch")
      for (int i = 2; i + 1 < argc; ++i)
        if (std::string(argv[i]) == "--") {
          if (unknown(argv[i + 1])) return 2;
          break;
        }
  }
  // `launch -n 2 train ...` without `--`: the hint shows the user's line with it.
  std::string launch_fixed;
  if (argc >= 2 && std::string(argv[1]) == "launch" &&
      std::none_of(argv + 2, argv + argc, [](const char* a) { return std::string(a) == "--"; })) {
    launch_fixed = "tessera launch";
    bool placed = false;
    for (int i = 2; i < argc; ++i) {
      if (!placed && std::find(names.begin(), names.end(), argv[i]) != names.end()) {
        launch_fixed += " --";
        placed = true;
      }
      launch_fixed += std::string(" ") + argv[i];
    }
    if (!placed) launch_fixed = "tessera launch -n 4 -- train --zero 3";
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const tessera::OutOfDeviceMemory& e) {
    std::fprintf(stderr,
                 "error: out of device memory: %s\nHINT: `tessera plan MODEL --batch B --seq T` "
                 "prints the bytes a run needs per rank; try a smaller --batch or --seq, "
                 "--recompute full or --precision bf16\n",
                 e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "error: out of memory: this machine (or `ulimit -v`) cannot hold what the command "
                 "allocates\nHINT: `tessera plan MODEL --batch B --seq T` prints the bytes a run "
                 "needs per rank; try a smaller --batch or --seq, --recompute full, or more ranks "
                 "with --zero 3\n");
    return 1;
  } catch (const CLI::ParseError& e) {
    if (!launch_fixed.empty())
      std::fprintf(stderr,
                   "error: %s\nHINT: put -- between launch's flags and the command it runs: %s\n",
                   e.what(), launch_fixed.c_str());
    else
      std::fprintf(stderr,
                   "error: %s\nHINT: run `tessera --help` or `tessera COMMAND --help` for the "
                   "accepted flags.\n",
                   e.what());
    return 2;
  }
  return 0;
}
