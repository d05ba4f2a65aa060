// docs/reference.md against the binary: every flag that `tessera COMMAND --help` prints is
// named in the reference, so the two cannot drift apart (a flag added without its documentation
// fails here, naming the command and the flag).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <string>

#include "train_fixture.h"

namespace tessera {
namespace {

TEST(Docs, TheReferenceNamesEveryFlagOfEveryCommand) {
  std::ifstream f(std::string(TESSERA_SOURCE_DIR) + "/docs/reference.md");
  ASSERT_TRUE(f.good()) << "docs/reference.md is missing";
  const std::string reference((std::istreambuf_iterator<char>(f)), {});
  const std::regex flag("--[a-z0-9][a-z0-9-]*");
  for (const char* command :
       {"train", "launch", "plan", "simulate", "validate", "calibrate", "graph", "sample",
        "tokenize", "report", "import hf", "export hf", "submit", "jobs", "cancel"}) {
    std::string help;
    ASSERT_EQ(run_command(std::string(TESSERA_BINARY) + " " + command + " --help", &help), 0)
        << command;
    std::set<std::string> flags;
    for (auto it = std::sregex_iterator(help.begin(), help.end(), flag);
         it != std::sregex_iterator(); ++it)
      flags.insert(it->str());
    EXPECT_GT(flags.size(), 1u) << command;
    for (const std::string& name : flags) {
      if (name == "--help") continue;
      // Named as a flag: followed by a space, a backtick, a bracket, '=' or punctuation.
      const std::regex named(name + "(?![a-z0-9-])");
      EXPECT_TRUE(std::regex_search(reference, named))
          << "tessera " << command << " " << name << " is not in docs/reference.md";
    }
  }
}

}  // namespace
}  // namespace tessera
