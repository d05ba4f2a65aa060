// `tessera report RUN_DIR`: a run's curves and plan as one self-contained HTML page, with PNG
// plots beside it, drawn by gnuplot (Debian's gnuplot-nox).
//
//   TS_ASSIGN_OR_RETURN(RunReport r, write_report("runs/default", "runs/default/report"));
//   // r.html == "runs/default/report/index.html"; r.pngs: loss.png, lr.png, throughput.png
//
// Reads RUN_DIR/metrics.jsonl (one JSON object per line: training steps with "loss", "lr",
// "tokens_per_s", "mfu", "grad_norm"; evaluations with "val_loss") and, when there is one,
// the manifest of the newest checkpoint (model, plan, training flags). The page embeds the
// plots as inline SVG, so it is one file that can be mailed; the PNGs are for slides.
//
// Failure behaviour: an error names the run directory and the line of metrics.jsonl that is
// not JSON (a last line cut off by a killed run is skipped, and counted in the report), a
// run with no training step yet, or gnuplot missing or failing (with its message). Files are
// written atomically; a failure leaves the previous report as it was.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace tessera {

struct RunReport {
  std::string html;                // the page
  std::vector<std::string> pngs;   // plots beside it
  int64_t steps = 0;               // training records read
  int64_t evals = 0;               // validation records read
  bool cut_last_line = false;      // a partial last line was skipped
  std::vector<std::string> notes;  // e.g. a step whose loss is not finite (a diverged run)
};

// `facts`: lines the page shows under the summary (the cost of a Slurm job).
Result<RunReport> write_report(const std::string& run_dir, const std::string& out_dir,
                               const std::vector<std::string>& facts = {});

}  // namespace tessera
