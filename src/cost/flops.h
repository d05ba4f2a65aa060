// FLOP accounting for MFU and HFU, and the analytic formulas published runs use.
//
//   MFU = model_flops_per_step / (step_time * devices * peak)
//         model FLOPs: forward + backward of the model once, no recomputation — in Tessera the
//         FLOPs of every compute node of the global training graph (op_flops), or for a
//         transformer 6*N*tokens + attention (the PaLM / MosaicML count).
//   HFU = hardware_flops_per_step / (step_time * devices * peak)
//         hardware FLOPs: what the devices actually execute, recomputed forward passes
//         included — the FLOPs of every compute instruction of the Program, per rank,
//         summed over ranks.
//   Megatron eq. (3) (Narayanan et al. 2021), per step with full recomputation:
//         96 * B * s * l * h^2 * (1 + s/(6h) + V/(16 l h))      — an HFU-like count.
//   Model FLOPs without recomputation (Korthikanti et al. 2022, App. A):
//         72 * B * s * l * h^2 * (1 + s/(6h) + V/(12 l h)).
#pragma once

#include <cstdint>

namespace tessera {

struct TransformerShape {
  double batch = 0;   // sequences per step (global)
  double seq = 0;     // s
  double layers = 0;  // l
  double hidden = 0;  // h
  double vocab = 0;   // V
};

double megatron_flops_with_recompute(const TransformerShape& t);  // eq. (3)
double megatron_model_flops(const TransformerShape& t);           // Korthikanti App. A
// 6*N + 12*l*h*s per token (PaLM, MosaicML's MFU), times batch*seq.
double palm_model_flops(const TransformerShape& t, double params);

}  // namespace tessera
