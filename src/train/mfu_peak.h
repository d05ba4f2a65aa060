// The peak FLOP/s a run's MFU is taken against (train's summary and metrics.jsonl), named:
// --peak-flops when given; else the device's datasheet peak at the run's dtype, for the GPUs
// of the shipped cluster presets (cost/cluster_spec.h datasheet_device, by the product name the
// driver reports), as every published MFU is; else this rank's measured GEMM rate (the CPU, or a
// device without a datasheet). The measured rate is kept beside a datasheet peak; with
// --peak-flops nothing is measured (measured = 0).
//
//   MfuPeak p = mfu_peak(backend, DType::bf16, o.peak_flops);
//   p.flops;     // 989.4e12 on an H100 SXM (bf16)
//   p.source;    // "H100-SXM5-80GB datasheet, bf16"
//   p.measured;  // this rank's GEMM rate, e.g. 777e12
#pragma once

#include <string>

#include "backend/backend.h"

namespace tessera {

struct MfuPeak {
  double flops = 0;
  std::string source;
  double measured = 0;
};

MfuPeak mfu_peak(Backend& backend, DType dtype, double given);

// This process's GEMM rate in FLOP/s: the best of 3 products of n x n matrices (under
// `launch`, ranks sharing cores each measure their share). On the CPU backend a 1024 x 1024
// sgemm on its threads (its bf16/f16 kernels compute in f32); on a device a 4096 x 4096 matmul
// node of the run's dtype.
double measured_gemm_peak(Backend& backend, DType dt);

}  // namespace tessera
