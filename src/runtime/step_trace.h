// A trace of one training step on this rank, as it ran: each compute instruction (its op and
// scope) and each wait for a collective on the compute track, and each collective or p2p
// transfer on the track of its rank group's comm stream ("comm dp", "comm tp", ...), from the
// communicators (comm/comm_trace.h). Written as Chrome/Perfetto JSON with one process per rank,
// the format `simulate --trace` writes, so a measured step and a predicted one read alike:
// where a comm span lies beside compute spans, the communication overlapped the compute.
//
//   StepTrace trace;
//   driver.set_trace(&trace);  ...one step...  driver.set_trace(nullptr);
//   std::string json = chrome_trace_json({{rank, trace.spans()}}, "gpt-mini dp=2");
//
// Times are the host's steady clock: on a CPU backend a compute span is the op's run; on a
// device it is the enqueue (the device's own timeline is the profiler's).
#pragma once

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm_trace.h"

namespace tessera {

struct TraceSpan {
  std::string track;          // "compute", "comm dp", ...
  std::string name;           // "matmul h.0.mlp.fc", "all_reduce grad bucket 3"
  double start = 0, end = 0;  // trace_clock() seconds
};

class StepTrace final : public CommTraceSink {
 public:
  void add(std::string track, std::string name, double start, double end);
  void record(const char* kind, const std::string& what, const std::string& axis, double start,
              double end, int64_t bytes) override;
  std::vector<TraceSpan> spans() const;

 private:
  mutable std::mutex mu_;
  std::vector<TraceSpan> spans_;
};

// The spans of each rank (rank, spans) as one Chrome/Perfetto trace: a process per rank, a
// thread per track, times in microseconds from the earliest span.
std::string chrome_trace_json(const std::vector<std::pair<int, std::vector<TraceSpan>>>& ranks,
                              const std::string& title);
// One rank's spans as JSON text and back, for gathering them on rank 0.
std::string spans_to_json(const std::vector<TraceSpan>& spans);
std::vector<TraceSpan> spans_from_json(const std::string& text);

}  // namespace tessera
