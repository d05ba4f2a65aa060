// Calibration of the cost model against the real runtime (DESIGN.md: the simulator times the
// Program the runtime executes, so the two can be compared): the CPU ranks of this machine, or
// one GPU (CalibrationOptions::backend). Every rank of the job measures at once — as in a real
// run, the ranks share cores and memory bandwidth:
//
//   1. the backend's GEMM throughput (a 1024^3 matmul node; 4096^3 on a device, also in the
//      run's low precision) and streaming bandwidth (a 32 MiB scale node; 1 GiB on a device):
//      the device's peak FLOP/s and memory_bandwidth;
//   2. every compute instruction of the Program of `model` under the requested plan, timed one
//      by one after warm-up steps: per op kind, efficiency = roofline time / measured time
//      (written to [efficiency]), and the launch overhead from the tiniest ops;
//   2b. the host side an offloaded optimizer uses: the host's streaming bandwidth (the node's:
//      every rank's at once), the fraction of it the CPU AdamW reaches, and the link between
//      the backend and host memory (64 MiB each way; a memcpy on the CPU backend);
//   3. all_reduce over the world at 4 KiB .. 4 MiB, fitted to the ring's α-β model: the node's
//      intra_latency and intra_bandwidth (all ranks of this machine are one node);
//   4. with check_steps > 0, the real training step (forward, backward, optimizer) of that
//      Program, against the simulator's prediction on the calibrated spec, and the planned
//      peak memory against the measured one.
//
//   TS_ASSIGN_OR_RETURN(Calibration c, calibrate(world, opts));   // collective over `world`
//   write_file_atomic("cpu-local.toml", cluster_spec_to_toml(c.spec));
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "cost/cluster_spec.h"

namespace tessera {

struct CalibrationOptions {
  // What is measured: the CPU backend of each rank (null), or a device's backend for one rank
  // (its name in words for the spec), at this precision (ModelConfig::dtype of the model).
  Backend* backend = nullptr;
  std::string device_name;
  DType precision = DType::f32;
  std::string model = "gpt-mini";  // preset or config.toml measured (and checked)
  int64_t batch = 0;               // global micro-batch (0: 4 per rank)
  int64_t seq = 128;
  int zero = 0;         // ZeRO stage of the measured plan
  int reps = 5;         // repetitions per measurement (the median is kept)
  int check_steps = 0;  // > 0: run and time this many real steps afterwards
  // The checked run may differ from the measured one, to show the spec carries over to other
  // plans and shapes (-1 / 0: the same as measured).
  int check_zero = -1;
  int64_t check_batch = 0;
  bool check_offload = false;  // the checked run with its optimizer offloaded to host memory
};

struct Calibration {
  ClusterSpec spec;
  std::vector<std::string> notes;  // what was measured, one line each
  // The check (check_steps > 0); times in seconds, memory in bytes per rank.
  double measured_step = 0, predicted_step = 0;
  // The noise of the measurement: (slowest - fastest) / median over the checked steps, the
  // largest over ranks. A quiet machine gives a few percent; a loaded one much more.
  double measured_step_noise = 0;
  // The part of a step after backward (offloaded: the whole offloaded phase).
  double measured_optimizer = 0, predicted_optimizer = 0;
  // Offloaded: the optimizer state in host memory per rank, allocated and planned.
  double measured_host_bytes = 0, predicted_host_bytes = 0;
  double measured_peak_memory = 0, predicted_peak_memory = 0;
};

Result<Calibration> calibrate(Communicator& world, const CalibrationOptions& opts);

}  // namespace tessera
