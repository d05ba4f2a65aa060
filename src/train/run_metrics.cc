#include "train/run_metrics.h"

#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "io/fs.h"

namespace tessera {

namespace {

// The "step" of one metrics line; -1 when the line is not an object with a numeric step.
int64_t step_of(const std::string& line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return -1;
  return j["step"].get<int64_t>();
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Keeps the records of steps before `start_step`; drops a cut-off last line.
Status trim_metrics(const std::string& path, int64_t start_step) {
  TS_ASSIGN_OR_RETURN(std::string text, read_file(path));
  std::vector<std::string> lines = split_lines(text);
  const bool cut_off = !text.empty() && text.back() != '\n';
  std::string kept;
  for (size_t i = 0; i < lines.size(); ++i) {
    const int64_t step = step_of(lines[i]);
    if (step >= start_step) continue;
    if (step < 0 && cut_off && i + 1 == lines.size()) continue;
    kept += lines[i] + "\n";
  }
  if (kept == text) return Status();
  return write_file_atomic(path, kept);
}

}  // namespace

Result<std::ofstream> open_run_metrics(const std::string& out, bool resume, int64_t start_step) {
  const std::string path = out + "/metrics.jsonl";
  if (path_exists(path)) {
    if (resume) {
      TS_RETURN_IF_ERROR(trim_metrics(path, start_step));
    } else {
      TS_ASSIGN_OR_RETURN(std::string text, read_file(path));
      if (!text.empty())
        return error("run directory '" + out +
                         "' holds metrics.jsonl of an earlier run that saved no checkpoint",
                     "choose another --out, or remove " + path + " to start over there");
    }
  }
  std::ofstream metrics(path, std::ios::app);
  if (!metrics) return error("cannot open " + path + " for appending");
  return metrics;
}

int64_t last_recorded_step(const std::string& out) {
  Result<std::string> text = read_file(out + "/metrics.jsonl");
  if (!text.ok()) return -1;
  int64_t last = -1;
  for (const std::string& line : split_lines(*text)) last = std::max(last, step_of(line));
  return last;
}

}  // namespace tessera
