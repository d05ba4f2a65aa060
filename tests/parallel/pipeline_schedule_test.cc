// The pipeline schedules' properties for many (stages, micro-batches, virtual stages): every
// action once, no deadlock, the stash each schedule promises, and the bubble of the formulas.
#include "parallel/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <set>
#include <tuple>

namespace tessera {
namespace {

const ScheduleKind kAll[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b,
                             ScheduleKind::interleaved, ScheduleKind::zb_h1};

// (stages, micro-batches, virtual stages) the schedule accepts.
std::vector<std::tuple<int, int, int>> shapes(ScheduleKind k) {
  std::vector<std::tuple<int, int, int>> out;
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 5, 8, 16, 32})
      for (int v : {1, 2, 3, 4}) {
        if (v > 1 && (k != ScheduleKind::interleaved || m % p != 0)) continue;
        out.emplace_back(p, m, v);
      }
  return out;
}

TEST(PipelineSchedule, EveryActionOnceOnItsStageAndNoDeadlock) {
  for (ScheduleKind k : kAll)
    for (auto [p, m, v] : shapes(k)) {
      SCOPED_TRACE(std::string(schedule_name(k)) + " p=" + std::to_string(p) +
                   " m=" + std::to_string(m) + " v=" + std::to_string(v));
      Result<PipelineSchedule> s = make_schedule(k, p, m, v);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      ASSERT_EQ(static_cast<int>(s->actions.size()), p);
      const bool split = k == ScheduleKind::zb_h1;
      for (const auto& list : s->actions) {
        std::set<std::tuple<PipeOp, int, int>> seen;
        for (const PipeAction& a : list) {
          EXPECT_TRUE(seen.insert({a.op, a.micro_batch, a.chunk}).second) << "twice";
          EXPECT_GE(a.chunk, 0);
          EXPECT_LT(a.chunk, v);
          EXPECT_GE(a.micro_batch, 0);
          EXPECT_LT(a.micro_batch, m);
          EXPECT_EQ(a.op == PipeOp::backward, !split && a.op != PipeOp::forward);
        }
        EXPECT_EQ(static_cast<int>(list.size()), m * v * (split ? 3 : 2));
      }
      Result<ScheduleTiming> t = time_schedule(*s, ChunkTimes::uniform(p * v, 1.0, 2.0));
      ASSERT_TRUE(t.ok()) << t.status().to_string();
      // No stage is busier than the span; the work is all there.
      for (double b : t->busy_seconds) {
        EXPECT_NEAR(b, 3.0 * m * v, 1e-9);
        EXPECT_LE(b, t->step_seconds + 1e-9);
      }
    }
}

// GPipe and 1F1B: (p-1)/(m+p-1) of each stage's time idles; interleaving over V chunks (each
// 1/V of the stage's work) divides the idle time by V: (p-1)/(V m + p-1).
TEST(PipelineSchedule, BubbleFractionMatchesTheFormulas) {
  for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved})
    for (auto [p, m, v] : shapes(k)) {
      SCOPED_TRACE(std::string(schedule_name(k)) + " p=" + std::to_string(p) +
                   " m=" + std::to_string(m) + " v=" + std::to_string(v));
      PipelineSchedule s = make_schedule(k, p, m, v).value();
      ScheduleTiming t = time_schedule(s, ChunkTimes::uniform(p * v, 1.0 / v, 2.0 / v)).value();
      const double expected = (p - 1.0) / (v * m + p - 1.0);
      EXPECT_NEAR(t.bubble_fraction, expected, 1e-9);
      EXPECT_NEAR(t.step_seconds, 3.0 * m + 3.0 * (p - 1) / v, 1e-9);
    }
}

// ZB-H1 (Qi et al. 2023): with at least as many micro-batches as stages the step is
// m (F + B + W) + (p-1)(F + B - W), against 1F1B's (m + p - 1)(F + B + W).
TEST(PipelineSchedule, ZeroBubbleH1FillsTheCoolDownWithWeightGradients) {
  for (auto [f, b, w] : {std::tuple{1.0, 1.0, 1.0}, std::tuple{1.0, 1.0, 0.5},
                         std::tuple{1.0, 1.2, 0.8}, std::tuple{1.0, 2.0, 1.0}})
    for (int p : {2, 3, 4, 8})
      for (int m : {p, p + 1, 2 * p, 4 * p}) {
        SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m) + " F/B/W=" +
                     std::to_string(f) + "/" + std::to_string(b) + "/" + std::to_string(w));
        ChunkTimes t;
        t.forward.assign(static_cast<size_t>(p), f);
        t.backward_input.assign(static_cast<size_t>(p), b);
        t.backward_weight.assign(static_cast<size_t>(p), w);
        ScheduleTiming zb =
            time_schedule(make_schedule(ScheduleKind::zb_h1, p, m).value(), t).value();
        ScheduleTiming one =
            time_schedule(make_schedule(ScheduleKind::one_f_one_b, p, m).value(), t).value();
        EXPECT_NEAR(zb.step_seconds, m * (f + b + w) + (p - 1) * (f + b - w), 1e-9);
        EXPECT_NEAR(one.step_seconds, (m + p - 1) * (f + b + w), 1e-9);
      }
}

TEST(PipelineSchedule, ActivationsInFlightPerStage) {
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 2, 4, 8, 16}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      PipelineSchedule g = make_schedule(ScheduleKind::gpipe, p, m).value();
      PipelineSchedule o = make_schedule(ScheduleKind::one_f_one_b, p, m).value();
      PipelineSchedule z = make_schedule(ScheduleKind::zb_h1, p, m).value();
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(max_in_flight(g, s), m);
        EXPECT_EQ(max_in_flight(o, s), std::min(p - s, m)) << "stage " << s;
        // Until its W: the p - s of 1F1B plus the s weight gradients stage s defers.
        EXPECT_EQ(max_in_flight(z, s), std::min(p, m)) << "stage " << s;
      }
      for (int v : {2, 4}) {
        if (m % p != 0) continue;
        PipelineSchedule i = make_schedule(ScheduleKind::interleaved, p, m, v).value();
        for (int s = 0; s < p; ++s)
          EXPECT_EQ(max_in_flight(i, s), std::min(m * v, (p - s - 1) * 2 + (v - 1) * p + 1))
              << "stage " << s << " v=" << v;
      }
    }
}

// A neighbour's activation or gradient takes p2p seconds to arrive: the fill and the drain of
// the pipeline each cross p - 1 links.
TEST(PipelineSchedule, PointToPointTimeLengthensFillAndDrain) {
  const int p = 4, m = 8;
  PipelineSchedule s = make_schedule(ScheduleKind::one_f_one_b, p, m).value();
  const double base = time_schedule(s, ChunkTimes::uniform(p, 1, 2)).value().step_seconds;
  const double slow = time_schedule(s, ChunkTimes::uniform(p, 1, 2, 0.1)).value().step_seconds;
  EXPECT_GE(slow, base + 2 * (p - 1) * 0.1 - 1e-9);
  EXPECT_LE(slow, base + 2 * (m + p - 1) * 0.1 + 1e-9);
}

// A send that blocks (DeepSpeed's pipeline engine) keeps its stage busy for the transfer: 1F1B
// on 2 stages, 2 micro-batches, F = 1, B = 2, p2p = 0.5 s. Asynchronous sends: stage 0 runs F0
// 0-1 and F1 1-2; stage 1 F0 1.5-2.5, B0 2.5-4.5, F1 4.5-5.5, B1 5.5-7.5; stage 0 B0 5-7, B1
// 8-10. Blocking: stage 0's F1 starts at 1.5 (after F0's send) and its send keeps it to 3.0;
// stage 1's B0 sends until 5.0, so F1 runs 5-6 and B1 6-8 (sent by 8.5); stage 0's B1 8.5-10.5.
TEST(PipelineSchedule, BlockingSendsHoldTheSendingStage) {
  PipelineSchedule s = make_schedule(ScheduleKind::one_f_one_b, 2, 2).value();
  ChunkTimes t = ChunkTimes::uniform(2, 1, 2, 0.5);
  EXPECT_DOUBLE_EQ(time_schedule(s, t).value().step_seconds, 10.0);
  t.blocking_p2p = true;
  const ScheduleTiming blocked = time_schedule(s, t).value();
  EXPECT_DOUBLE_EQ(blocked.step_seconds, 10.5);
  EXPECT_DOUBLE_EQ(blocked.start[0][1], 1.5);  // stage 0's F1, after F0's send
  EXPECT_DOUBLE_EQ(blocked.start[1][2], 5.0);  // stage 1's F1, after B0's send
  // The busy time is the compute alone: the sends are idle time on the stage.
  EXPECT_DOUBLE_EQ(blocked.busy_seconds[0], 6.0);
}

TEST(PipelineSchedule, BadShapesAreErrors) {
  auto message = [](Result<PipelineSchedule> r) {
    return r.ok() ? std::string("ok") : r.status().to_string();
  };
  EXPECT_NE(message(make_schedule(ScheduleKind::one_f_one_b, 0, 4)).find("stages must be >= 1"),
            std::string::npos);
  EXPECT_NE(message(make_schedule(ScheduleKind::one_f_one_b, 2, 0)).find("micro-batches"),
            std::string::npos);
  EXPECT_NE(message(make_schedule(ScheduleKind::one_f_one_b, 2, 4, 2))
                .find("only the interleaved schedule has virtual stages"),
            std::string::npos);
  const std::string m = message(make_schedule(ScheduleKind::interleaved, 4, 6, 2));
  EXPECT_NE(m.find("micro-batches (6) to be a multiple of the pipeline stages (4)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("use 8 micro-batches"), std::string::npos) << m;
  EXPECT_EQ(parse_schedule("zb-h1").value(), ScheduleKind::zb_h1);
  EXPECT_EQ(parse_schedule("1f1b").value(), ScheduleKind::one_f_one_b);
  EXPECT_NE(parse_schedule("1F1B").status().message().find("gpipe, 1f1b, interleaved, zb-h1"),
            std::string::npos);
}

TEST(PipelineSchedule, AnOrderThatWaitsOnItselfIsAnError) {
  PipelineSchedule s = make_schedule(ScheduleKind::one_f_one_b, 2, 2).value();
  // The last stage runs micro-batch 1's backward before its forward.
  std::swap(s.actions[1][2], s.actions[1][3]);
  std::swap(s.actions[1][0], s.actions[1][3]);
  Result<ScheduleTiming> t = time_schedule(s, ChunkTimes::uniform(2, 1, 2));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("stage 1 at action 1 (B micro-batch 0, chunk 0)"),
            std::string::npos)
      << t.status().to_string();
}

}  // namespace
}  // namespace tessera
