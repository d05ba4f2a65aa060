#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

#include "base/check.h"

namespace tessera {

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::gpipe:
      return "gpipe";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::interleaved:
      return "interleaved";
    case ScheduleKind::zb_h1:
      return "zb-h1";
  }
  return "?";
}

Result<ScheduleKind> parse_schedule(std::string_view name) {
  for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                         ScheduleKind::zb_h1})
    if (name == schedule_name(k)) return k;
  return error(
      "schedule '" + std::string(name) + "' is not one of: gpipe, 1f1b, interleaved, zb-h1",
      "1f1b keeps the fewest activations; interleaved (with virtual stages) and zb-h1 "
      "shrink the bubble");
}

std::vector<int> interleavings(int64_t layers, int pp) {
  std::vector<int> out;
  for (int v : {2, 4})
    if (v * pp <= layers) out.push_back(v);
  if (pp > 0 && layers % pp == 0)
    for (int v = 3; v <= 8; ++v)
      if (v != 4 && (layers / pp) % v == 0) out.push_back(v);
  std::sort(out.begin(), out.end());
  return out;
}

const char* pipe_op_name(PipeOp op) {
  switch (op) {
    case PipeOp::forward:
      return "F";
    case PipeOp::backward:
      return "B";
    case PipeOp::backward_input:
      return "Bi";
    case PipeOp::backward_weight:
      return "W";
  }
  return "?";
}

namespace {

using Actions = std::vector<PipeAction>;

PipeAction fwd(int mb, int chunk = 0) { return {PipeOp::forward, mb, chunk}; }
PipeAction bwd(int mb, int chunk = 0) { return {PipeOp::backward, mb, chunk}; }

Actions gpipe(int m) {
  Actions a;
  for (int i = 0; i < m; ++i) a.push_back(fwd(i));
  for (int i = 0; i < m; ++i) a.push_back(bwd(i));
  return a;
}

// The shape every schedule but GPipe shares: `warmup` forwards, then one forward and one
// backward alternately, then the remaining backwards. forward(j) / backward(j) append the
// stage's j-th forward / backward.
template <class Forward, class Backward>
void warmup_steady_cooldown(int total, int warmup, Forward forward, Backward backward) {
  for (int j = 0; j < warmup; ++j) forward(j);
  for (int i = 0; i < total - warmup; ++i) {
    forward(warmup + i);
    backward(i);
  }
  for (int j = total - warmup; j < total; ++j) backward(j);
}

// PipeDream-Flush: p-s-1 warm-up forwards on stage s.
Actions one_f_one_b(int p, int m, int s) {
  Actions a;
  warmup_steady_cooldown(
      m, std::min(p - s - 1, m), [&](int j) { a.push_back(fwd(j)); },
      [&](int j) { a.push_back(bwd(j)); });
  return a;
}

// Megatron's interleaved 1F1B: the j-th forward of a stage is micro-batch
// (j / (p V)) p + j % p of chunk (j / p) % V; backwards visit the chunks in reverse.
Actions interleaved(int p, int m, int v, int s) {
  const int total = m * v;
  auto mb = [&](int j) { return (j / (p * v)) * p + j % p; };
  Actions a;
  warmup_steady_cooldown(
      total, std::min((p - s - 1) * 2 + (v - 1) * p, total),
      [&](int j) { a.push_back(fwd(mb(j), (j / p) % v)); },
      [&](int j) { a.push_back(bwd(mb(j), v - 1 - (j / p) % v)); });
  return a;
}

// ZB-H1: 1F1B's order of forwards and input gradients (B); stage s keeps up to s weight
// gradients (W) pending and runs the oldest whenever it has more, so the later stages, whose
// input gradients the earlier ones wait for, run their B's first and their W's in the
// cool-down, where the earlier stages would otherwise idle.
Actions zb_h1(int p, int m, int s) {
  Actions a;
  std::deque<int> pending;
  auto input_grad = [&](int i) {
    a.push_back({PipeOp::backward_input, i, 0});
    pending.push_back(i);
    if (static_cast<int>(pending.size()) > s) {
      a.push_back({PipeOp::backward_weight, pending.front(), 0});
      pending.pop_front();
    }
  };
  warmup_steady_cooldown(
      m, std::min(p - s - 1, m), [&](int j) { a.push_back(fwd(j)); }, input_grad);
  for (int i : pending) a.push_back({PipeOp::backward_weight, i, 0});
  return a;
}

}  // namespace

Result<PipelineSchedule> make_schedule(ScheduleKind kind, int stages, int micro_batches,
                                       int virtual_stages) {
  if (stages < 1) return error("pipeline stages must be >= 1, got " + std::to_string(stages));
  if (micro_batches < 1)
    return error("pipeline micro-batches must be >= 1, got " + std::to_string(micro_batches));
  if (virtual_stages < 1)
    return error("virtual stages must be >= 1, got " + std::to_string(virtual_stages));
  if (virtual_stages > 1 && kind != ScheduleKind::interleaved)
    return error(std::to_string(virtual_stages) + " virtual stages with schedule " +
                     schedule_name(kind) + ": only the interleaved schedule has virtual stages",
                 "use --schedule interleaved, or one virtual stage");
  if (kind == ScheduleKind::interleaved && virtual_stages > 1 && micro_batches % stages != 0)
    return error("the interleaved schedule needs the micro-batches (" +
                     std::to_string(micro_batches) + ") to be a multiple of the pipeline stages (" +
                     std::to_string(stages) + ")",
                 "use " + std::to_string((micro_batches / stages + 1) * stages) +
                     " micro-batches (--grad-accum), or the 1f1b schedule");
  PipelineSchedule out;
  out.kind = kind;
  out.stages = stages;
  out.micro_batches = micro_batches;
  out.virtual_stages = virtual_stages;
  for (int s = 0; s < stages; ++s) {
    switch (kind) {
      case ScheduleKind::gpipe:
        out.actions.push_back(gpipe(micro_batches));
        break;
      case ScheduleKind::one_f_one_b:
        out.actions.push_back(one_f_one_b(stages, micro_batches, s));
        break;
      case ScheduleKind::interleaved:
        out.actions.push_back(virtual_stages > 1
                                  ? interleaved(stages, micro_batches, virtual_stages, s)
                                  : one_f_one_b(stages, micro_batches, s));
        break;
      case ScheduleKind::zb_h1:
        out.actions.push_back(zb_h1(stages, micro_batches, s));
        break;
    }
  }
  return out;
}

int max_in_flight(const PipelineSchedule& s, int stage) {
  // A micro-batch's activations of one chunk live from its forward to its last backward part.
  const bool split = s.kind == ScheduleKind::zb_h1;
  int live = 0, most = 0;
  for (const PipeAction& a : s.actions.at(static_cast<size_t>(stage))) {
    if (a.op == PipeOp::forward) most = std::max(most, ++live);
    if (a.op == (split ? PipeOp::backward_weight : PipeOp::backward)) --live;
  }
  return most;
}

ChunkTimes ChunkTimes::uniform(int chunks, double forward, double backward, double p2p) {
  ChunkTimes t;
  t.forward.assign(static_cast<size_t>(chunks), forward);
  t.backward_input.assign(static_cast<size_t>(chunks), backward / 2);
  t.backward_weight.assign(static_cast<size_t>(chunks), backward / 2);
  t.p2p = p2p;
  return t;
}

Result<ScheduleTiming> time_schedule(const PipelineSchedule& s, const ChunkTimes& t) {
  const int p = s.stages, k_last = s.chunks() - 1;
  TS_CHECK_EQ(static_cast<int>(t.forward.size()), s.chunks());
  TS_CHECK_EQ(static_cast<int>(t.backward_input.size()), s.chunks());
  TS_CHECK_EQ(static_cast<int>(t.backward_weight.size()), s.chunks());
  const bool split = s.kind == ScheduleKind::zb_h1;
  // When each (op, micro-batch, model chunk) ends; B stands for the input gradient's end.
  using Key = std::tuple<PipeOp, int, int>;
  std::map<Key, double> end;
  auto grad_op = split ? PipeOp::backward_input : PipeOp::backward;
  ScheduleTiming r;
  r.busy_seconds.assign(static_cast<size_t>(p), 0.0);
  r.start.resize(static_cast<size_t>(p));
  r.end.resize(static_cast<size_t>(p));
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free(static_cast<size_t>(p), 0.0);
  size_t remaining = 0;
  for (const auto& list : s.actions) remaining += list.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int st = 0; st < p; ++st) {
      const auto& list = s.actions[static_cast<size_t>(st)];
      size_t& i = next[static_cast<size_t>(st)];
      while (i < list.size()) {
        const PipeAction& a = list[i];
        const int k = s.model_chunk(st, a.chunk);
        const size_t ku = static_cast<size_t>(k);
        // The action this one waits for, and whether its result crosses to another stage.
        Key dep;
        bool has_dep = true, remote = false;
        bool sends = false;  // its result goes to a neighbouring chunk's stage
        double dur = 0;
        switch (a.op) {
          case PipeOp::forward:
            has_dep = k > 0;
            dep = {PipeOp::forward, a.micro_batch, k - 1};
            remote = true;
            sends = k < k_last;
            dur = t.forward[ku];
            break;
          case PipeOp::backward:
          case PipeOp::backward_input:
            remote = k < k_last;
            dep = remote ? Key{grad_op, a.micro_batch, k + 1}
                         : Key{PipeOp::forward, a.micro_batch, k};
            sends = k > 0;
            dur = t.backward_input[ku] + (split ? 0 : t.backward_weight[ku]);
            break;
          case PipeOp::backward_weight:
            dep = {PipeOp::backward_input, a.micro_batch, k};
            dur = t.backward_weight[ku];
            break;
        }
        double ready = 0;
        if (has_dep) {
          auto it = end.find(dep);
          if (it == end.end()) break;  // not run yet: another stage first
          // Neighbouring model chunks sit on different stages unless there is one stage.
          ready = it->second + (remote && p > 1 ? t.p2p : 0.0);
        }
        const double start = std::max(free[static_cast<size_t>(st)], ready);
        free[static_cast<size_t>(st)] =
            start + dur + (t.blocking_p2p && sends && p > 1 ? t.p2p : 0);
        end[{a.op, a.micro_batch, k}] = start + dur;
        r.busy_seconds[static_cast<size_t>(st)] += dur;
        r.start[static_cast<size_t>(st)].push_back(start);
        r.end[static_cast<size_t>(st)].push_back(start + dur);
        ++i;
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      std::string waits;
      for (int st = 0; st < p; ++st) {
        const auto& list = s.actions[static_cast<size_t>(st)];
        const size_t i = next[static_cast<size_t>(st)];
        if (i < list.size())
          waits += std::string(waits.empty() ? "" : "; ") + "stage " + std::to_string(st) +
                   " at action " + std::to_string(i) + " (" + pipe_op_name(list[i].op) +
                   " micro-batch " + std::to_string(list[i].micro_batch) + ", chunk " +
                   std::to_string(list[i].chunk) + ")";
      }
      return error("pipeline schedule " + std::string(schedule_name(s.kind)) +
                   " deadlocks: every stage waits for an action no stage can run: " + waits);
    }
  }
  r.step_seconds = *std::max_element(free.begin(), free.end());
  double idle = 0;
  for (double b : r.busy_seconds) idle += r.step_seconds > 0 ? 1 - b / r.step_seconds : 0;
  r.bubble_fraction = idle / p;
  return r;
}

}  // namespace tessera
