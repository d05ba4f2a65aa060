#include "cost/flops.h"

namespace tessera {

double megatron_flops_with_recompute(const TransformerShape& t) {
  double h = t.hidden, l = t.layers, s = t.seq;
  return 96.0 * t.batch * s * l * h * h * (1.0 + s / (6.0 * h) + t.vocab / (16.0 * l * h));
}

double megatron_model_flops(const TransformerShape& t) {
  double h = t.hidden, l = t.layers, s = t.seq;
  return 72.0 * t.batch * s * l * h * h * (1.0 + s / (6.0 * h) + t.vocab / (12.0 * l * h));
}

double palm_model_flops(const TransformerShape& t, double params) {
  return (6.0 * params + 12.0 * t.layers * t.hidden * t.seq) * t.batch * t.seq;
}

}  // namespace tessera
