#include "base/check.h"

#include <cstdio>
#include <cstdlib>

namespace tessera {

namespace {
int g_rank = -1;
}

void set_process_rank(int rank) { g_rank = rank; }
int process_rank() { return g_rank; }

namespace detail {
CheckFailure::CheckFailure(const char* file, int line, const std::string& what) {
  out_ << file << ":" << line << ": " << what;
  if (g_rank >= 0) out_ << " [rank " << g_rank << "]";
  out_ << " ";
}

CheckFailure::~CheckFailure() {
  std::fprintf(stderr, "Tessera internal error (a bug, please report it): %s\n",
               out_.str().c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail
}  // namespace tessera
