#include "train/report.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/checkpoint.h"
#include "io/fs.h"

extern char** environ;

namespace tessera {

namespace {

using json = nlohmann::json;

struct Metrics {
  // Training steps: step, loss, lr, throughput (tokens/s, or images/s for image models), MFU,
  // gradient norm (NaN where absent).
  std::vector<std::array<double, 6>> train;
  std::string unit = "tokens";             // what the throughput counts: "tokens" or "images"
  std::vector<std::array<double, 2>> val;  // step, validation loss
  bool cut_last_line = false;
  std::vector<std::string> notes;  // records read but worth a word (a non-finite loss)
};

double number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
}

Result<Metrics> read_metrics(const std::string& path) {
  TS_ASSIGN_OR_RETURN(std::string text, read_file(path));
  Metrics m;
  std::istringstream in(text);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error&) {
      // A run killed mid-write leaves a partial last line; anything else is damage.
      if (in.peek() == EOF && text.back() != '\n') {
        m.cut_last_line = true;
        break;
      }
      return error(path + ":" + std::to_string(n) + " is not a JSON object",
                   "metrics.jsonl holds one JSON object per line as `tessera train` writes it");
    }
    if (!j.is_object()) return error(path + ":" + std::to_string(n) + " is not a JSON object");
    // A record whose step or loss is not a number, or a training step recorded twice, is
    // damage too (hand edits, two runs' records in one file).
    const std::string at = path + ":" + std::to_string(n);
    const char* loss_key = j.contains("val_loss") ? "val_loss" : "loss";
    if (j.contains(loss_key)) {
      if (!j.contains("step") || !j["step"].is_number_integer())
        return error(at + " has no integer \"step\"",
                     "metrics.jsonl holds one record per line as `tessera train` writes it");
      if (j[loss_key].is_null()) {  // a non-finite loss (JSON has no NaN): the run diverged
        m.notes.push_back("step " + j["step"].dump() + "'s " + loss_key +
                          " is not finite (null in metrics.jsonl: the run diverged there)");
      } else if (!j[loss_key].is_number()) {
        return error(at + ": \"" + loss_key + "\" is " + j[loss_key].dump() + ", not a number",
                     "metrics.jsonl holds one record per line as `tessera train` writes it");
      }
      if (!j.contains("val_loss") && !m.train.empty() && number(j, "step") <= m.train.back()[0])
        return error(at + " records step " + j["step"].dump() + " again (after step " +
                         std::to_string(static_cast<long long>(m.train.back()[0])) + ")",
                     "the file holds records of two runs or a copy of its lines; `tessera train "
                     "--resume` keeps each step once");
    }
    if (j.contains("val_loss"))
      m.val.push_back({number(j, "step"), number(j, "val_loss")});
    else if (j.contains("loss")) {
      const bool images = !j.contains("tokens_per_s") && j.contains("images_per_s");
      if (images) m.unit = "images";
      m.train.push_back({number(j, "step"), number(j, "loss"), number(j, "lr"),
                         number(j, images ? "images_per_s" : "tokens_per_s"), number(j, "mfu"),
                         number(j, "grad_norm")});
    }
  }
  if (m.train.empty())
    return error(path + " has no training step yet",
                 "report a run after its first step (tessera train writes one line per step)");
  return m;
}

Status write_text(const std::string& path, const std::string& text) {
  TS_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::open(path));
  TS_RETURN_IF_ERROR(w.append(text));
  return w.commit();
}

// Rows of numbers, one line each, as gnuplot reads them.
template <size_t N>
std::string data_file(const std::vector<std::array<double, N>>& rows) {
  std::string s;
  char buf[32];
  for (const auto& r : rows) {
    for (size_t i = 0; i < N; ++i) {
      std::snprintf(buf, sizeof buf, i + 1 < N ? "%.17g " : "%.17g\n", r[i]);
      s += buf;
    }
  }
  return s;
}

// Whether column `c` of the training rows has a number anywhere (gnuplot refuses a series
// without one).
bool has_values(const Metrics& m, size_t c) {
  for (const auto& r : m.train)
    if (std::isfinite(r[c])) return true;
  return false;
}

// One gnuplot script that draws each plot twice: PNG (for files) and SVG (inlined).
std::string gnuplot_script(const Metrics& m) {
  const bool with_val = !m.val.empty();
  const std::string per_s = m.unit + "/s";
  // The throughput plot's series: those the records have.
  std::string series;
  if (has_values(m, 3))
    series += "'train.dat' using 1:4 with lines lw 2 lc rgb '#9467bd' title '" + per_s + "'";
  if (has_values(m, 4))
    series += std::string(series.empty() ? "" : ", ") +
              "'train.dat' using 1:($5*100) axes x1y2 with lines lw 2 lc rgb '#ff7f0e' title 'MFU'";
  if (series.empty()) series = "0 title 'no throughput recorded'";
  std::string s =
      "set grid lc rgb '#dddddd'\nset key top right\nset xlabel 'step'\nset datafile missing "
      "'nan'\n";
  const char* terms[][2] = {{"pngcairo size 960,480 font 'sans,11'", "png"},
                            {"svg size 960,480 font 'sans,11' background rgb 'white'", "svg"}};
  for (const auto& t : terms) {
    const std::string ext = t[1];
    s += std::string("set terminal ") + t[0] + "\n";
    s += "set output 'loss." + ext +
         "'\nset title 'loss'\nset ylabel 'cross-entropy'\nunset y2tics\n";
    s += "plot 'train.dat' using 1:2 with lines lw 2 lc rgb '#1f77b4' title 'training loss'";
    if (with_val)
      s += ", 'val.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'validation "
           "loss'";
    s += "\nset output 'lr." + ext + "'\nset title 'learning rate'\nset ylabel 'lr'\n";
    s += "plot 'train.dat' using 1:3 with lines lw 2 lc rgb '#2ca02c' title 'learning rate'\n";
    s += "set output 'throughput." + ext + "'\nset title 'throughput'\nset ylabel '" + per_s +
         "'\nset y2label 'MFU (%)'\nset y2tics\n";
    s += "set key below\n";
    s += "plot " + series + "\n";
    s += "unset y2label\nunset y2tics\nset key top right\n";
  }
  return s;
}

// Runs gnuplot on `script` in `dir`; its stderr goes to dir/gnuplot.err.
Status run_gnuplot(const std::string& dir, const std::string& script) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string err = join_path(dir, "gnuplot.err");
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addchdir_np(&fa, dir.c_str());
  std::vector<char*> argv = {const_cast<char*>("gnuplot"), const_cast<char*>(script.c_str()),
                             nullptr};
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, "gnuplot", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    return error("cannot run gnuplot (" + std::string(std::strerror(rc)) + ")",
                 "install it: apt-get install gnuplot-nox");
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status();
  Result<std::string> msg = read_file(err);
  return error("gnuplot failed drawing the report: " + (msg.ok() ? *msg : std::string("?")));
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out += c;
  }
  return out;
}

// An SVG file without its XML prolog, to inline.
Result<std::string> inline_svg(const std::string& path) {
  TS_ASSIGN_OR_RETURN(std::string s, read_file(path));
  const size_t at = s.find("<svg");
  return at == std::string::npos ? s : s.substr(at);
}

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return std::nan("");
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "–";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string summary_table(const Metrics& m, const json& manifest) {
  const auto& last = m.train.back();
  std::vector<double> tps, mfu;
  for (size_t i = 1; i < m.train.size(); ++i) {  // step 0 includes warm-up
    tps.push_back(m.train[i][3]);
    mfu.push_back(m.train[i][4]);
  }
  if (tps.empty()) tps.push_back(last[3]), mfu.push_back(last[4]);
  double best_val = std::nan("");
  for (const auto& v : m.val)
    if (!(best_val <= v[1])) best_val = v[1];
  std::vector<std::pair<std::string, std::string>> rows = {
      {"training steps recorded",
       std::to_string(m.train.size()) + " (last step " + fixed(last[0], 0) + ")"},
      {"last training loss", fixed(last[1], 4)},
      {"last validation loss", m.val.empty() ? "–" : fixed(m.val.back()[1], 4)},
      {"best validation loss", fixed(best_val, 4)},
      {"median " + m.unit + "/s", fixed(median(tps), 0)},
      {"median MFU", fixed(100 * median(mfu), 1) + " %"}};
  if (manifest.is_object()) {
    if (manifest.contains("model"))
      rows.push_back(
          {"model", manifest["model"].value("name", "?") + ": " + manifest["model"].dump()});
    if (manifest.contains("train")) rows.push_back({"training flags", manifest["train"].dump()});
  }
  std::string s = "<table>\n";
  for (const auto& [k, v] : rows)
    s += "<tr><th>" + escape(k) + "</th><td>" + escape(v) + "</td></tr>\n";
  return s + "</table>\n";
}

}  // namespace

Result<RunReport> write_report(const std::string& run_dir, const std::string& out_dir,
                               const std::vector<std::string>& facts) {
  const std::string metrics_path = join_path(run_dir, "metrics.jsonl");
  if (!is_directory(run_dir))
    return error("run directory " + run_dir + " does not exist",
                 "pass the --out of a `tessera train` run");
  if (!path_exists(metrics_path))
    return error("run directory " + run_dir + " has no metrics.jsonl",
                 "pass the --out of a `tessera train` run");
  TS_ASSIGN_OR_RETURN(Metrics m, read_metrics(metrics_path));
  json manifest;  // the newest checkpoint's, when the run wrote one
  const std::string ckpts = join_path(run_dir, "checkpoints");
  if (path_exists(join_path(ckpts, "latest"))) {
    Result<std::string> dir = resolve_checkpoint(ckpts);
    if (dir.ok()) {
      Result<std::string> text = read_file(join_path(*dir, "manifest.json"));
      if (text.ok()) manifest = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    }
  }

  if (path_exists(out_dir) && !is_directory(out_dir))
    return error(
        "--out " + out_dir + " is a file; the report is a folder (index.html and its plots)",
        "pass a folder to create, or leave --out out for RUN_DIR/report");
  TS_RETURN_IF_ERROR(make_dirs(out_dir));
  const std::string staging =
      join_path(out_dir, ".tmp-report-" + std::to_string(static_cast<long>(::getpid())));
  TS_RETURN_IF_ERROR(remove_all(staging));
  TS_RETURN_IF_ERROR(make_dirs(staging));
  RunReport r;
  Status s = [&]() -> Status {
    TS_RETURN_IF_ERROR(write_text(join_path(staging, "train.dat"), data_file(m.train)));
    TS_RETURN_IF_ERROR(write_text(join_path(staging, "val.dat"), data_file(m.val)));
    TS_RETURN_IF_ERROR(write_text(join_path(staging, "plot.gp"), gnuplot_script(m)));
    TS_RETURN_IF_ERROR(run_gnuplot(staging, "plot.gp"));
    std::string html =
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Tessera run " +
        escape(run_dir) +
        "</title>\n<style>body{font-family:sans-serif;margin:2em;max-width:1000px}"
        "table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:4px 8px;"
        "text-align:left;vertical-align:top}td{font-family:monospace;word-break:break-all}"
        "pre{background:#f6f6f6;padding:1em;overflow:auto}</style></head><body>\n"
        "<h1>Tessera run " +
        escape(run_dir) + "</h1>\n" + summary_table(m, manifest);
    for (const std::string& fact : facts) html += "<p>" + escape(fact) + "</p>\n";
    if (m.cut_last_line)
      html += "<p>The last line of metrics.jsonl was cut off (a killed run) and is left out.</p>\n";
    for (const std::string& note : m.notes) html += "<p>Note: " + escape(note) + ".</p>\n";
    for (const char* plot : {"loss", "lr", "throughput"}) {
      TS_ASSIGN_OR_RETURN(std::string svg,
                          inline_svg(join_path(staging, plot + std::string(".svg"))));
      html += std::string("<h2>") + plot + "</h2>\n" + svg + "\n<p><a href=\"" + plot + ".png\">" +
              plot + ".png</a></p>\n";
    }
    if (manifest.is_object() && manifest.contains("plan"))
      html += "<h2>plan</h2>\n<pre>" + escape(manifest["plan"].dump(2)) + "</pre>\n";
    html += "</body></html>\n";
    TS_RETURN_IF_ERROR(write_text(join_path(staging, "index.html"), html));
    for (const char* plot : {"loss", "lr", "throughput"}) {
      const std::string name = plot + std::string(".png");
      TS_RETURN_IF_ERROR(rename_path(join_path(staging, name), join_path(out_dir, name)));
      r.pngs.push_back(join_path(out_dir, name));
    }
    r.html = join_path(out_dir, "index.html");
    return rename_path(join_path(staging, "index.html"), r.html);
  }();
  (void)remove_all(staging);
  if (!s.ok()) return s;
  r.steps = static_cast<int64_t>(m.train.size());
  r.evals = static_cast<int64_t>(m.val.size());
  r.cut_last_line = m.cut_last_line;
  r.notes = m.notes;
  return r;
}

}  // namespace tessera
