#include "base/format.h"

#include <cmath>
#include <cstdio>

namespace tessera {

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", bytes, units[u]);
  }
  return buf;
}

std::string format_count(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  int count = 0;
  for (auto it = digits.rbegin(); it != digits.rend(); ++it) {
    if (count > 0 && count % 3 == 0) out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++count;
  }
  return n < 0 ? "-" + out : out;
}

std::string format_fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string format_si(double value) {
  static const char* units[] = {"", " K", " M", " G", " T", " P", " E"};
  int u = 0;
  while (std::fabs(value) >= 1000.0 && u < 6) {
    value /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s" : "%.2f%s", value, units[u]);
  return buf;
}

std::string format_duration(double seconds) {
  char buf[32];
  if (seconds < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  } else if (seconds < 3600) {
    int s = static_cast<int>(seconds);
    std::snprintf(buf, sizeof buf, "%dm%02ds", s / 60, s % 60);
  } else if (seconds < 86400) {
    int m = static_cast<int>(seconds / 60);
    std::snprintf(buf, sizeof buf, "%dh%02dm", m / 60, m % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f days", seconds / 86400);
  }
  return buf;
}

}  // namespace tessera
