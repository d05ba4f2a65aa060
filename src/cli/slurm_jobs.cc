#include "cli/slurm_jobs.h"

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/fs.h"

namespace tessera {

std::string jobs_file() {
  if (const char* f = std::getenv("TESSERA_JOBS_FILE")) return f;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.tessera/jobs.jsonl";
}

Status record_job(const SubmittedJob& job) {
  const std::string path = jobs_file();
  TS_RETURN_IF_ERROR(make_dirs(parent_dir(path)));
  const nlohmann::json line = {{"id", job.id},
                               {"flavor", job.flavor},
                               {"devices", job.devices},
                               {"price_per_hour", job.price_per_hour},
                               {"out", job.out},
                               {"model", job.model},
                               {"tokens_per_step", job.tokens_per_step}};
  std::ofstream f(path, std::ios::app);
  f << line.dump() << "\n";
  f.flush();
  if (!f)
    return error("cannot append to the jobs file '" + path + "'",
                 "set TESSERA_JOBS_FILE to a file you can write");
  return Status();
}

Result<std::vector<SubmittedJob>> recorded_jobs() {
  std::vector<SubmittedJob> jobs;
  const std::string path = jobs_file();
  if (!path_exists(path)) return jobs;
  std::ifstream f(path);
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.empty()) continue;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      jobs.push_back({j.at("id").get<std::string>(), j.at("flavor").get<std::string>(),
                      j.at("devices").get<int>(), j.at("price_per_hour").get<double>(),
                      j.at("out").get<std::string>(), j.at("model").get<std::string>(),
                      j.at("tokens_per_step").get<double>()});
    } catch (const nlohmann::json::exception&) {
      return error(path + ":" + std::to_string(n) + " is not a job tessera submit recorded",
                   "remove the line (the file holds one JSON object per submission)");
    }
  }
  return jobs;
}

double slurm_elapsed_seconds(const std::string& text) {
  std::string t = text;
  double days = 0;
  if (const size_t dash = t.find('-'); dash != std::string::npos) {
    days = std::atof(t.substr(0, dash).c_str());
    t = t.substr(dash + 1);
  }
  std::vector<double> parts;
  size_t at = 0;
  while (at <= t.size()) {
    const size_t colon = t.find(':', at);
    const std::string p = t.substr(at, colon == std::string::npos ? std::string::npos : colon - at);
    if (p.empty() || p.find_first_not_of("0123456789.") != std::string::npos) return -1;
    parts.push_back(std::atof(p.c_str()));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  double s = 0;
  for (double p : parts) s = s * 60 + p;  // [HH:]MM:SS
  return parts.size() > 3 || parts.size() < 2 ? -1 : days * 86400 + s;
}

}  // namespace tessera
