#include "base/format.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(Format, Units) {
  EXPECT_EQ(format_count(124439808), "124,439,808");
  EXPECT_EQ(format_count(-1000), "-1,000");
  EXPECT_EQ(format_count(12), "12");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_si(1.2e12), "1.20 T");
  EXPECT_EQ(format_fixed(2.345, 1), "2.3");
  EXPECT_EQ(format_duration(3 * 86400.0 + 7200), "3.1 days");
  EXPECT_EQ(format_fixed(12.0, 3), "12.000");
  EXPECT_EQ(format_duration(125), "2m05s");
}

}  // namespace
}  // namespace tessera
