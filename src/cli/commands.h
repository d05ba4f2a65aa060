// The `tessera` subcommands. Each add_*_command registers its flags on the CLI11 app; each run_*
// function does the work and returns a Status that main() prints in one paragraph.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "base/status.h"
#include "train/train_options.h"

namespace tessera {

// Where the shipped data lives (tokenizer files, corpus); overridable with TESSERA_DATA_DIR.
std::string default_data_dir();

void add_train_command(CLI::App& app, TrainOptions& opts);
Status run_train(const TrainOptions& opts);

void add_graph_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_simulate_command(CLI::App& app);
void add_validate_command(CLI::App& app);
void add_calibrate_command(CLI::App& app);
void add_launch_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
// `import hf` and `export hf`.
void add_hf_commands(CLI::App& app);
void add_report_command(CLI::App& app);
// `submit`: a training run planned for a flavor's GPUs, as a Slurm batch job.
void add_submit_command(CLI::App& app);
// `jobs` and `cancel JOB`: the jobs submit sent, their state and cost; a graceful stop.
void add_jobs_commands(CLI::App& app);

}  // namespace tessera
