// `tessera calibrate`: measures this machine's ranks — backend GEMM and bandwidth, every op of a
// real training step, MPI collectives — and writes a ClusterSpec TOML that `tessera simulate
// --cluster FILE` uses. Run it with as many ranks as the runs it should predict, or on one GPU:
//   tessera launch -n 2 -- calibrate --out cpu-local.toml --check 5
//   tessera calibrate --device cuda --precision bf16 --batch 8 --seq 1024 --out gpu.toml
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "base/format.h"
#include "calibrate/calibrate.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "comm/local_comm.h"
#include "comm/mpi_comm.h"
#include "io/fs.h"

namespace tessera {

namespace {

struct CalibrateCli {
  CalibrationOptions opts;
  std::string out = "cpu-local.toml";
  std::string device = "cpu";
  std::string collectives = "auto";  // --collectives
  std::string precision = "fp32";
};

// Calibrating GPUs measures one in one process: several GPU ranks would time collectives that
// go through host memory over MPI (the runtime does not use NCCL yet), not the GPUs' network.
Status check_calibrated_device(const std::string& device, bool several_ranks) {
  TS_RETURN_IF_ERROR(check_device(device));
  if (device == "cuda" && several_ranks)
    return error("calibrate --device cuda measures one GPU in one process",
                 "run it without `launch`/mpirun; several GPU ranks exchange through host "
                 "memory over MPI (NCCL is not used yet), which is not the GPUs' network");
  return Status();
}

Status run_calibrate(const CalibrateCli& o) {
  // Where the spec goes, checked before minutes of measuring.
  std::error_code ec;
  if (std::filesystem::is_directory(o.out, ec))
    return error(
        "--out '" + o.out + "' is a directory; calibrate writes one TOML file",
        "pass a file path, e.g. --out " + (std::filesystem::path(o.out) / "cluster.toml").string());
  const std::filesystem::path parent = std::filesystem::absolute(o.out, ec).parent_path();
  if (!std::filesystem::is_directory(parent, ec))
    return error("--out '" + o.out + "': directory '" + parent.string() + "' does not exist",
                 "create it first, or write the spec elsewhere");
  CalibrationOptions opts = o.opts;
  const std::optional<DType> precision = parse_dtype(o.precision);
  if (!precision || *precision == DType::i32)
    return error("--precision must be fp32, bf16 or fp16 (or f32, f16), got '" + o.precision + "'");
  opts.precision = *precision;
  // `tessera launch` asks first, in one process, whether the flags suit that many ranks.
  if (const char* n = std::getenv("TESSERA_LAUNCH_CHECK"))
    return check_calibrated_device(o.device, std::atoi(n) > 1);
  TS_RETURN_IF_ERROR(check_calibrated_device(o.device, launched_by_mpirun()));
  TS_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, join_mpi_job(o.collectives));
  std::vector<std::unique_ptr<Communicator>> local;
  if (!world) local = make_local_comms(1);
  Communicator& w = world ? *world : *local[0];
  TS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> device, open_device(o.device));
  if (device) {
    opts.backend = device.get();
    opts.device_name = device_description(*device);
  }
  TS_ASSIGN_OR_RETURN(Calibration c, calibrate(w, opts));
  if (w.rank() != 0) return Status();
  for (const std::string& n : c.notes) std::printf("measured   %s\n", n.c_str());
  std::string toml = "# " + c.spec.description + "\n" + cluster_spec_to_toml(c.spec);
  TS_RETURN_IF_ERROR(write_file_atomic(o.out, toml));
  std::printf("wrote      %s (use: tessera simulate MODEL --cluster %s --gpus %d --precision %s)\n",
              o.out.c_str(), o.out.c_str(), w.size(),
              opts.precision == DType::f32 ? "f32" : dtype_name(opts.precision));
  if (o.opts.check_steps > 0) {
    std::printf(
        "check      step time: predicted %.4f s, measured %.4f s (median of %d), error "
        "%+.1f%%\n",
        c.predicted_step, c.measured_step, o.opts.check_steps,
        100.0 * (c.predicted_step / c.measured_step - 1));
    std::printf("check      of which optimizer%s: predicted %.4f s, measured %.4f s\n",
                o.opts.check_offload ? " (offloaded to the host)" : "", c.predicted_optimizer,
                c.measured_optimizer);
    if (o.opts.check_offload)
      std::printf("check      host memory per rank: predicted %s, measured %s (allocated)\n",
                  format_bytes(c.predicted_host_bytes).c_str(),
                  format_bytes(c.measured_host_bytes).c_str());
    std::printf(
        "check      peak memory per rank: predicted %s, measured %s (arena high-water + "
        "allocated state), error %+.2f%%\n",
        format_bytes(c.predicted_peak_memory).c_str(), format_bytes(c.measured_peak_memory).c_str(),
        100.0 * (c.predicted_peak_memory / c.measured_peak_memory - 1));
  }
  return Status();
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto o = std::make_shared<CalibrateCli>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate", "Measure this machine's ranks and write a cluster spec for the simulator");
  cmd->add_option("--out", o->out, "Cluster spec TOML to write")->capture_default_str();
  cmd->add_option("--device", o->device,
                  "cpu (each rank of the job), or cuda: GPU 0 in one process")
      ->capture_default_str();
  cmd->add_option("--collectives", o->collectives, kCollectivesHelp)
      ->check(CLI::IsMember({"auto", "ring", "mpi"}))
      ->capture_default_str();
  cmd->add_option("--precision", o->precision,
                  "fp32, bf16 or fp16: the dtype the model is stored and measured in (a low "
                  "precision also measures its GEMM peak)")
      ->capture_default_str();
  cmd->add_option("--model", o->opts.model, "Model whose ops are measured")->capture_default_str();
  cmd->add_option("--batch", o->opts.batch, "Global micro-batch (default: 4 per rank)");
  cmd->add_option("--seq", o->opts.seq, "Sequence length")->capture_default_str();
  cmd->add_option("--zero", o->opts.zero, "ZeRO stage of the measured plan")->capture_default_str();
  cmd->add_option("--reps", o->opts.reps, "Repetitions per measurement (median)")
      ->capture_default_str();
  cmd->add_option("--check", o->opts.check_steps,
                  "Then time this many real steps and compare with the simulator");
  cmd->add_option("--check-zero", o->opts.check_zero,
                  "ZeRO stage of the checked run (default: the measured one)");
  cmd->add_option("--check-batch", o->opts.check_batch,
                  "Global micro-batch of the checked run (default: the measured one)");
  cmd->add_flag("--check-offload", o->opts.check_offload,
                "Check a run with its optimizer offloaded to host memory (--offload optimizer)");
  cmd->callback([o] { exit_on_error(run_calibrate(*o)); });
}

}  // namespace tessera
