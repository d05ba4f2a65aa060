#include "cli/common.h"

#include <cstdio>

#include "base/check.h"
#include "cli/commands.h"
#include "comm/mpi_comm.h"

namespace tessera {

std::string default_data_dir() {
  if (const char* env = std::getenv("TESSERA_DATA_DIR")) return env;
  return TESSERA_DEFAULT_DATA_DIR;
}

void exit_on_error(const Status& s) {
  if (s.ok()) return;
  std::fprintf(stderr, "error: %s\n", s.message().c_str());
  if (!s.hint().empty()) std::fprintf(stderr, "HINT: %s\n", s.hint().c_str());
  std::fflush(stderr);
  std::exit(1);
}

Result<std::unique_ptr<Communicator>> join_mpi_job() {
  if (!launched_by_mpirun()) return std::unique_ptr<Communicator>();
  TS_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, mpi_world(nullptr, nullptr));
  install_termination_reporter();
  set_process_rank(world->rank());
  return world;
}

}  // namespace tessera
