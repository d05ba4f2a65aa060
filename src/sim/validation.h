// Validation of the simulator against published training runs (validation/published_runs.csv,
// see validation/README.md): each row that the current Program can express is rebuilt — model,
// plan, cluster preset, precision — simulated, and compared on the metric the source
// published; every other row is listed with the reason it cannot be modelled.
//
//   TS_ASSIGN_OR_RETURN(std::vector<PublishedRun> runs, read_published_runs(path));
//   ValidationReport rep = validate_runs(runs, /*threads=*/2);
//   std::fputs(format_report(rep, /*per_row=*/true).c_str(), stdout);
//
// The metric, in this order of preference: tokens/s per GPU; seconds per iteration; TFLOP/s
// per GPU counted with Megatron's eq. (3) (the predicted value uses the same formula on the
// predicted step time). error = predicted / published - 1.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "cost/cluster_spec.h"
#include "models/model.h"
#include "sim/simulator.h"

namespace tessera {

struct PublishedRun {
  std::map<std::string, std::string> fields;               // column -> cell, as in the CSV
  const std::string& at(const std::string& column) const;  // "" when absent
};

// RFC 4180 CSV with a header row. Errors name the file and line.
Result<std::vector<PublishedRun>> read_published_runs(const std::string& path);

// A node's network bandwidth in Gb/s from a row's inter_node_network cell: "1600 Gbps
// node-node interconnect", "2 Tb/s RoCE (per node)", a count of links ("8x 400 Gb/s InfiniBand
// NDR", "8x HDR InfiniBand 200Gb/s HCAs": their sum), Omni-Path's "4 links per node" (100 Gb/s
// each). False when the cell names no rate.
bool node_network_gbits(const std::string& cell, double* gbits);

// The NVLink links of each GPU from a row's intra_node_link cell: "NVLink 4 inter-gpu
// connects", "4 NVLink GPU-to-GPU interconnects", "12 NVLink links". 0 when it gives no count
// ("NVLink3 + NVSwitch (DGX A100)", "NVLink4/NVSwitch 900 GB/s": a generation, not a count).
int device_nvlinks(const std::string& cell);

// What a row becomes: a model, a plan and a cluster to simulate, and the number to match.
struct RunSetup {
  ModelConfig model;
  Plan plan;
  int64_t batch = 0, seq = 0;  // global micro-batch (sequences) and sequence length
  ClusterSpec cluster;
  SimOptions sim;
  // "tokens/s/GPU", "s/iteration", "TFLOP/s/GPU (eq.3)", "TFLOP/s/GPU (model)" (Megatron-LM's
  // model FLOPs of a GPT: megatron_model_flops), or "scaling eff. %" (per-GPU throughput on the
  // plan's GPUs over that on scale_from_gpus, the smallest of a range).
  std::string metric;
  int scale_from_gpus = 0;
  double published = 0;
  std::vector<std::string> assumptions;  // what was inferred rather than read from the row
  // Knobs the row does not publish ("micro_batch", "zero", "recompute", and for a partly
  // filled plan with tensor ranks "sequence_parallel", with pipeline stages in a framework
  // that interleaves them "virtual_stages"), which fill_unpublished chooses as the planner
  // would; and what it chose, one line each.
  std::vector<std::string> unpublished;
  std::vector<std::string> filled;
  std::string framework;  // the row's, as published (how it cuts an interleaved pipeline)
};

// The heads of rows that do not publish them, from the row of the same source, architecture
// (the words before any parenthesis) and hidden size that does and whose published size (params_B)
// is nearest, when the rows at that size agree (a source's candidates of one width share their
// heads); the row's kHeadsFrom cell names the row they came from, and setup_run says so. Other rows
// are left to setup_run's guess (128-wide heads, or the nearest count that divides).
inline constexpr const char* kHeadsFrom = "heads_from_row";
std::vector<PublishedRun> borrow_sibling_heads(std::vector<PublishedRun> runs);

// Fails with the reason when the row cannot be modelled yet (missing fields, tensor or
// pipeline parallelism, FP8, ...). Cluster presets come from `cluster_dir`/<preset>.toml when
// given (to validate edited or calibrated specs), else from the shipped presets.
Result<RunSetup> setup_run(const PublishedRun& run, const std::string& cluster_dir = "");

// Builds the row's model at its micro-batch, places a tensor axis by the sharding search and
// simulates the plan.
Result<SimResult> simulate_setup(RunSetup* s);
// The knobs a row does not publish (RunSetup::unpublished), chosen as the planner chooses:
// every value of each — micro-batches the divisors of the per-rank batch up to 16 (with the
// global batch held), ZeRO 0-3 (0-1 with a pipeline), recomputation none, selective or full,
// and with tensor ranks sequence parallelism off or on (when the row does not say) — with the
// published knobs held, the fastest plan that fits the device (none fitting: the one
// needing the least memory). Sets the setup to it, says what it chose in `filled`, and returns
// its simulation.
Result<SimResult> fill_unpublished(RunSetup* s);

struct RunResult {
  std::string row_id, source, model;
  RunSetup setup;
  SimResult sim;
  double predicted = 0, error = 0;  // error = predicted / published - 1
};

struct ExcludedRun {
  std::string row_id, source, model, reason;
};

struct SourceStats {
  std::string source;
  int rows = 0;
  double median = 0, p90 = 0, max = 0;  // of |error|
};

struct ValidationReport {
  std::vector<RunResult> results;
  std::vector<ExcludedRun> excluded;
  // One per source over its rows with published plans, then "all" of those, then "filled
  // knobs": the rows whose unpublished knobs fill_unpublished chose.
  std::vector<SourceStats> stats;
  // The rows with published plans again, by the kind of plan (plan_kind), in that order.
  std::vector<SourceStats> kinds;
};

// The kind of a plan, for the report's second table: "context or expert parallel", "pipeline"
// (with or without tensor parallelism), "tensor parallel", "FSDP / ZeRO-3 / HSDP", or "data
// parallel, ZeRO-0/1/2" (the first that applies).
const char* plan_kind(const Plan& p);

// `only_source` (a source_key) limits the rows; threads simulate rows in parallel.
ValidationReport validate_runs(const std::vector<PublishedRun>& runs, int threads,
                               const std::string& only_source = "",
                               const std::string& cluster_dir = "");

std::string format_report(const ValidationReport& rep, bool per_row);
// The rows not modelled, each with its reason (the last part of format_report).
std::string format_excluded(const ValidationReport& rep);

// |error| percentiles by the nearest-rank method (p in [0, 1]).
double percentile(std::vector<double> v, double p);

}  // namespace tessera
