#include "train/run_control.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <string>

#include "comm/mpi_comm.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_stop{0};

void on_stop_signal(int sig) {
  // `tessera launch` passes a stop on as SIGUSR1 (SIGTERM) or SIGUSR2 (SIGINT): the user's.
  const bool from_launch = sig == SIGUSR1 || sig == SIGUSR2;
  const int stop = sig == SIGUSR1 ? SIGTERM : sig == SIGUSR2 ? SIGINT : sig;
  int none = 0;
  if (g_stop.compare_exchange_strong(none, stop)) {
    const char msg[] =
        "\ntessera: stopping after this step (saving a checkpoint); send the signal again to "
        "exit at once\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    // Under MPI the launcher also sends SIGTERM when a rank died: a rank waiting on it says so
    // now, since the step will not finish. (Not for a stop launch passed on.)
    if (!from_launch) write_collective_wait();
    return;
  }
  std::signal(stop, SIG_DFL);  // the second signal: the default action, now
  std::raise(stop);
}

}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGUSR2, &sa, nullptr);
}

int pending_stop_signal() { return g_stop.load(); }

Result<RunDirLock> RunDirLock::acquire(const std::string& dir) {
  const std::string path = dir + "/.lock";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return error("cannot create " + path + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {};
    ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    const std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown";
    return error("run directory '" + dir + "' is in use by another tessera run (pid " +
                     holder.substr(0, holder.find('\n')) + ")",
                 "wait for it to finish, stop it, or choose another --out");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    ::close(fd);
    return error("cannot write " + path + ": " + std::strerror(errno));
  }
  return RunDirLock(fd);
}

RunDirLock& RunDirLock::operator=(RunDirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

Result<int> remove_stale_staging(const std::string& dir) {
  const fs::path root = fs::path(dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return 0;
  int removed = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    if (e.path().filename().string().rfind(".tmp-", 0) != 0) continue;
    fs::remove_all(e.path(), ec);
    if (ec)
      return error("cannot remove the stale checkpoint staging directory " + e.path().string() +
                   ": " + ec.message());
    ++removed;
  }
  if (ec) return error("cannot list " + root.string() + ": " + ec.message());
  return removed;
}

}  // namespace tessera
