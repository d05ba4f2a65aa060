#include "base/status.h"

#include <gtest/gtest.h>

#include "base/check.h"

namespace tessera {
namespace {

Result<int> parse_positive(int x) {
  if (x <= 0) return error("value " + std::to_string(x) + " is not positive", "pass x > 0");
  return x;
}

Status use(int x, int* out) {
  TS_ASSIGN_OR_RETURN(*out, parse_positive(x));
  return Status();
}

TEST(Status, OkAndErrorCarryMessageAndHint) {
  EXPECT_TRUE(Status().ok());
  Status s = error("bad key 'n_head'", "use an integer");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.to_string(), "bad key 'n_head'\nHINT: use an integer");
  EXPECT_EQ(s.with_context("config.toml").message(), "config.toml: bad key 'n_head'");
}

TEST(Status, AssignOrReturnPropagates) {
  int v = 0;
  EXPECT_TRUE(use(3, &v).ok());
  EXPECT_EQ(v, 3);
  Status s = use(-1, &v);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "value -1 is not positive");
}

TEST(Check, FailingCheckAbortsWithOperands) {
  int a = 2, b = 3;
  EXPECT_DEATH({ TS_CHECK_EQ(a, b) << "extra"; }, "a == b.*2 vs 3.*extra");
}

}  // namespace
}  // namespace tessera
