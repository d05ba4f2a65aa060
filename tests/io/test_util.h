// Helpers shared by the io tests: a scratch directory removed at the end of each test, a guard
// that clears the file-system fault hook, and a substring check on error messages.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "io/fs.h"

namespace tessera::testing {

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const char* base = std::getenv("TMPDIR");
    path_ = std::string(base && *base ? base : "/tmp") + "/tessera_io_test-" +
            std::to_string(::getpid()) + "-" + std::to_string(counter++);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Installs a fault hook for one scope; clears it even when an assertion returns early.
struct HookGuard {
  explicit HookGuard(FsFaultHook hook) { set_fs_fault_hook(std::move(hook)); }
  ~HookGuard() { set_fs_fault_hook(nullptr); }
};

inline bool contains(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

}  // namespace tessera::testing
