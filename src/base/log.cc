#include "base/log.h"

#include <cstdio>

#include "base/check.h"

namespace tessera {

namespace {
LogLevel g_level = LogLevel::info;
}

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }

namespace detail {
LogLine::~LogLine() {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::string prefix;
  if (process_rank() >= 0) prefix = "[rank " + std::to_string(process_rank()) + "] ";
  if (level_ != LogLevel::info) prefix += std::string(names[static_cast<int>(level_)]) + ": ";
  std::fprintf(stderr, "%s%s\n", prefix.c_str(), out_.str().c_str());
}
}  // namespace detail
}  // namespace tessera
