// tessera: train, inspect and sample transformer models written once for one device.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"

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
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr,
                 "error: %s\nHINT: run `tessera --help` or `tessera COMMAND --help` for the "
                 "accepted flags.\n",
                 e.what());
    return 2;
  }
  return 0;
}
