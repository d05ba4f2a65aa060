// Training progress: a redrawn bar with step, loss, tokens/s and ETA on a terminal; plain log
// lines every `log_every` steps otherwise (CI logs, pipes).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tessera {

class Progress {
 public:
  // `unit`: what the throughput counts per second ("tok/s", "img/s").
  Progress(int64_t total_steps, int64_t start_step, int64_t log_every, std::string unit = "tok/s");
  void update(int64_t step, double loss, double per_second);
  void note(const std::string& line);  // printed on its own line
  void finish();

 private:
  int64_t total_, start_, log_every_;
  std::string unit_;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace tessera
