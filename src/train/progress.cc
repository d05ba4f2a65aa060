#include "train/progress.h"

#include <unistd.h>

#include <cstdio>
#include <utility>

#include "base/format.h"

namespace tessera {

Progress::Progress(int64_t total, int64_t start, int64_t log_every, std::string unit)
    : total_(total),
      start_(start),
      log_every_(log_every > 0 ? log_every : 1),
      unit_(std::move(unit)),
      tty_(isatty(STDERR_FILENO) != 0),
      t0_(std::chrono::steady_clock::now()) {}

void Progress::update(int64_t step, double loss, double tps) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  double done = static_cast<double>(step - start_);
  double eta = done > 0 ? elapsed / done * static_cast<double>(total_ - step) : 0;
  if (tty_) {
    const int width = 30;
    int filled = static_cast<int>(width * static_cast<double>(step) / static_cast<double>(total_));
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r[%s] step %lld/%lld  loss %.4f  %.0f %s  ETA %s   ", bar.c_str(),
                 (long long)step, (long long)total_, loss, tps, unit_.c_str(),
                 format_duration(eta).c_str());
    std::fflush(stderr);
    drawn_ = true;
  } else if (step % log_every_ == 0 || step == total_ || step == start_ + 1) {
    std::fprintf(stderr, "step %lld/%lld  loss %.4f  %.0f %s  elapsed %s  ETA %s\n",
                 (long long)step, (long long)total_, loss, tps, unit_.c_str(),
                 format_duration(elapsed).c_str(), format_duration(eta).c_str());
  }
}

void Progress::note(const std::string& line) {
  if (tty_ && drawn_) std::fputc('\n', stderr);
  drawn_ = false;
  std::fprintf(stderr, "%s\n", line.c_str());
}

void Progress::finish() {
  if (tty_ && drawn_) std::fputc('\n', stderr);
  drawn_ = false;
}

}  // namespace tessera
