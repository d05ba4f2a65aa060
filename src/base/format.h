// Human-readable units: format_bytes(3.5e9) == "3.26 GiB", format_count(124439808) ==
// "124,439,808", format_si(1.2e12) == "1.20 T".
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

std::string format_bytes(double bytes);
std::string format_count(int64_t n);
std::string format_si(double value);
std::string format_duration(double seconds);           // "12.3s", "3m05s", "1h02m", "3.2 days"
std::string format_fixed(double value, int decimals);  // format_fixed(2.345, 1) == "2.3"

}  // namespace tessera
