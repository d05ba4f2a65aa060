// Where a communicator reports each operation's span when a trace is being taken (train
// --trace): the kind, what and axis, the seconds on the steady clock when its comm stream
// started and finished it, and its bytes. Called from comm threads: implementations lock.
//
//   comm.set_trace_sink(&trace);   ...operations...   comm.set_trace_sink(nullptr);
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

class CommTraceSink {
 public:
  virtual ~CommTraceSink() = default;
  virtual void record(const char* kind, const std::string& what, const std::string& axis,
                      double start, double end, int64_t bytes) = 0;
};

// Seconds on the steady clock, the time base of every span (the same across the processes of
// one machine).
double trace_clock();

}  // namespace tessera
