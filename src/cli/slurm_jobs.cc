#include "cli/slurm_jobs.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/common.h"
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

Result<std::map<std::string, JobUsage>> slurm_usage(const std::string& sacct,
                                                    const std::vector<std::string>& ids) {
  std::string list;
  for (const std::string& id : ids) list += (list.empty() ? "" : ",") + id;
  // -D: a requeued job's every run (its earlier runs held the devices too), oldest first.
  std::string said;
  const int rc = run_captured(shell_quote(sacct) + " -X -D --noheader --parsable2 -j " +
                                  shell_quote(list) + " --format=JobID,State,Elapsed,ExitCode",
                              &said);
  if (rc != 0)
    return error("Slurm's accounting (`" + sacct + "`) failed (exit code " + std::to_string(rc) +
                     "): " + said,
                 "run this where Slurm's sacct works (its accounting storage enabled)");
  std::map<std::string, JobUsage> used;
  std::istringstream lines(said);
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> f;  // JobID, State, Elapsed[, ExitCode]
    for (size_t at = 0;;) {
      const size_t bar = line.find('|', at);
      f.push_back(line.substr(at, bar == std::string::npos ? std::string::npos : bar - at));
      if (bar == std::string::npos) break;
      at = bar + 1;
    }
    if (f.size() < 3) continue;
    JobUsage& u = used[f[0]];
    u.state = f[1];
    // Ranks that stopped on SIGTERM or SIGINT (tessera cancel, the time limit's warning) saved
    // a checkpoint, and the batch script exits with their 143 or 130: Slurm says FAILED, with
    // the exit code less 128 (it reads 128 + N as the shell's "signal N").
    // (The batch script exits with the ranks' code; an error they print is 1, never 2 or 15.)
    if (u.state == "FAILED" && f.size() > 3 &&
        (f[3] == "15:0" || f[3] == "2:0" || f[3] == "143:0" || f[3] == "130:0"))
      u.state = "STOPPED";
    u.seconds += std::max(slurm_elapsed_seconds(f[2]), 0.0);
    ++u.runs;
  }
  return used;
}

JobCost job_cost(const SubmittedJob& job, const JobUsage& used, double tokens) {
  JobCost c;
  c.device_hours = used.seconds / 3600 * job.devices;
  c.dollars = used.seconds / 3600 * job.price_per_hour;
  if (tokens > 0 && job.price_per_hour > 0) c.per_million_tokens = c.dollars / tokens * 1e6;
  return c;
}

std::pair<int64_t, double> last_training_record(const std::string& out) {
  std::ifstream f(out + "/metrics.jsonl");
  std::string line;
  int64_t step = -1;
  double rate = 0;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("loss") || !j.contains("step")) continue;
    if (!j["step"].is_number_integer()) continue;
    step = j["step"].get<int64_t>();
    for (const char* key : {"tokens_per_s", "images_per_s"})
      if (j.contains(key) && j[key].is_number()) rate = j[key].get<double>();
  }
  return {step, rate};
}

Result<std::string> submitted_run_cost(const std::string& run_dir, const std::string& sacct) {
  TS_ASSIGN_OR_RETURN(std::vector<SubmittedJob> jobs, recorded_jobs());
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::weakly_canonical(run_dir, ec);
  if (ec) return std::string();
  const SubmittedJob* job = nullptr;  // the newest submission of this directory
  for (const SubmittedJob& j : jobs) {
    const std::filesystem::path out = std::filesystem::weakly_canonical(j.out, ec);
    if (!ec && out == dir) job = &j;
  }
  if (job == nullptr) return std::string();
  TS_ASSIGN_OR_RETURN(auto used, slurm_usage(sacct, {job->id}));
  const JobUsage u = used.count(job->id) ? used.at(job->id) : JobUsage{};
  const int64_t steps = last_training_record(job->out).first + 1;
  const JobCost c = job_cost(*job, u, static_cast<double>(steps) * job->tokens_per_step);
  char line[512];
  std::snprintf(line, sizeof line, "job %s on %s (%d run%s, %s): %.4f GPU-hours, $%.4f",
                job->id.c_str(), job->flavor.c_str(), u.runs, u.runs == 1 ? "" : "s",
                u.state.c_str(), c.device_hours, c.dollars);
  std::string s = line;
  if (c.per_million_tokens >= 0) {
    std::snprintf(line, sizeof line, ", $%.4f per million tokens", c.per_million_tokens);
    s += line;
  }
  return s;
}

}  // namespace tessera
