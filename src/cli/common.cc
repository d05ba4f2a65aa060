#include "cli/common.h"

#include <cstdio>

#include "cli/commands.h"

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

}  // namespace tessera
