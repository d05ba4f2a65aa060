// Minimal logging to stderr, prefixed with the rank in multi-process runs.
//
//   TS_LOG(info) << "planned peak " << format_bytes(peak);
#pragma once

#include <sstream>

namespace tessera {

enum class LogLevel { debug, info, warn, error };
void set_log_level(LogLevel level);
LogLevel log_level();

namespace detail {
class LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level) {}
  ~LogLine();
  std::ostream& stream() { return out_; }

 private:
  LogLevel level_;
  std::ostringstream out_;
};
}  // namespace detail
}  // namespace tessera

#define TS_LOG(level)                                        \
  if (::tessera::LogLevel::level < ::tessera::log_level()) { \
  } else                                                     \
    ::tessera::detail::LogLine(::tessera::LogLevel::level).stream()
