#include "planner/quality.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

// The shipped table's llm.c rows (GPT-2 124M .. 1.5B and GPT-3 125M on 8 A100s, ZeRO-1): the
// planner's best plan predicts at least the published configuration's throughput wherever that
// configuration fits in memory (it is in the search space). `tessera validate --planner` runs
// this over every simulated row.
TEST(PlannerQuality, AutoPlanIsAtLeastThePublishedPlanWhereTheSpaceHoldsIt) {
  Result<std::vector<PublishedRun>> runs =
      read_published_runs(std::string(TESSERA_SOURCE_DIR) + "/validation/published_runs.csv");
  ASSERT_TRUE(runs.ok()) << runs.status().to_string();
  ValidationReport rep = validate_runs(runs.value(), 2, "llmc_scripts");
  ASSERT_FALSE(rep.results.empty());
  PlannerQuality q = planner_quality(rep, 2);
  ASSERT_EQ(q.rows.size(), rep.results.size());
  EXPECT_EQ(q.failed, 0) << format_planner_quality(q, true);
  int at_least = 0;
  for (const PlannerRow& r : q.rows) {
    EXPECT_GT(r.auto_tokens_per_s, 0) << r.row_id;
    if (r.published_fits) {
      EXPECT_GE(r.ratio, 1 - 1e-9) << format_planner_quality(q, true);
    }
    at_least += r.ratio >= 1 - 1e-9;
  }
  EXPECT_EQ(q.at_least_published, at_least);
  EXPECT_LE(q.min_ratio, q.median_ratio);
  EXPECT_LE(q.median_ratio, q.max_ratio);
  const std::string text = format_planner_quality(q, false);
  EXPECT_NE(text.find("auto plan / published plan"), std::string::npos) << text;
}

}  // namespace
}  // namespace tessera
