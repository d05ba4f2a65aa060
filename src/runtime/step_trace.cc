#include "runtime/step_trace.h"

#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

namespace tessera {

void StepTrace::add(std::string track, std::string name, double start, double end) {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.push_back({std::move(track), std::move(name), start, end});
}

void StepTrace::record(const char* kind, const std::string& what, const std::string& axis,
                       double start, double end, int64_t bytes) {
  (void)bytes;
  add("comm " + axis, std::string(kind) + " " + what, start, end);
}

std::vector<TraceSpan> StepTrace::spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_;
}

std::string chrome_trace_json(const std::vector<std::pair<int, std::vector<TraceSpan>>>& ranks,
                              const std::string& title) {
  double origin = std::numeric_limits<double>::infinity();
  for (const auto& [rank, spans] : ranks)
    for (const TraceSpan& s : spans) origin = std::min(origin, s.start);
  nlohmann::json events = nlohmann::json::array();
  for (const auto& [rank, spans] : ranks) {
    events.push_back({{"ph", "M"},
                      {"pid", rank},
                      {"name", "process_name"},
                      {"args", {{"name", title + " rank " + std::to_string(rank)}}}});
    std::map<std::string, int> tid;  // the compute track first, then the comm tracks by name
    tid["compute"] = 0;
    for (const TraceSpan& s : spans) tid.emplace(s.track, 0);
    int next = 0;
    for (auto& [track, id] : tid) id = track == "compute" ? 0 : ++next;
    for (const auto& [track, id] : tid)
      events.push_back({{"ph", "M"},
                        {"pid", rank},
                        {"tid", id},
                        {"name", "thread_name"},
                        {"args", {{"name", track}}}});
    for (const TraceSpan& s : spans)
      events.push_back({{"ph", "X"},
                        {"pid", rank},
                        {"tid", tid.at(s.track)},
                        {"name", s.name},
                        {"cat", s.track == "compute" ? "compute" : "comm"},
                        {"ts", (s.start - origin) * 1e6},
                        {"dur", (s.end - s.start) * 1e6}});
  }
  nlohmann::json doc = {{"displayTimeUnit", "ms"}, {"traceEvents", std::move(events)}};
  return doc.dump() + "\n";
}

std::string spans_to_json(const std::vector<TraceSpan>& spans) {
  nlohmann::json a = nlohmann::json::array();
  for (const TraceSpan& s : spans) a.push_back({s.track, s.name, s.start, s.end});
  return a.dump();
}

std::vector<TraceSpan> spans_from_json(const std::string& text) {
  std::vector<TraceSpan> out;
  for (const auto& e : nlohmann::json::parse(text))
    out.push_back(
        {e[0].get<std::string>(), e[1].get<std::string>(), e[2].get<double>(), e[3].get<double>()});
  return out;
}

}  // namespace tessera
