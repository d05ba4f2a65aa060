// Helpers shared by the data library's tests: a scratch directory that removes itself,
// whole-file I/O, and the repository's GPT-2 tokenizer loaded once per process.
//
//   ScratchDir dir;
//   write_bytes(dir.file("x.bin"), "...");
//   const Tokenizer& tok = repo_tokenizer();
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "data/tokenizer.h"

namespace tessera::testing_util {

inline const std::string kRepo = TESSERA_SOURCE_DIR;

class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tessera_data_XXXXXX").string();
    char* made = ::mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr) << "mkdtemp " << tmpl;
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Names of the entries in the directory, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::string path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  ASSERT_TRUE(out.good()) << "writing " << path;
}

// The tokenizer of data/gpt2/, loaded on first use (aborts the test binary if it fails,
// since every tokenizer test depends on it).
inline const Tokenizer& repo_tokenizer() {
  static const Tokenizer* tok = [] {
    auto r = Tokenizer::load(kRepo + "/data/gpt2");
    if (!r.ok()) {
      ADD_FAILURE() << r.status().to_string();
      std::abort();
    }
    return new Tokenizer(std::move(r).value());
  }();
  return *tok;
}

}  // namespace tessera::testing_util
