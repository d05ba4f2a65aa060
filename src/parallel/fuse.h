// The fusion pass: GEMM epilogues and residual norms (ir/ops_fused.cc) made of a rank's local
// graph, after autodiff, recomputation and partitioning, so that the Program the runtime executes,
// the simulator times and the memory planner sizes is the fused one.
//
//   matmul -> add(bias [N])                 => matmul_bias
//   matmul -> add(bias [N]) -> gelu          => matmul_bias_gelu (pre kept for gelu_grad)
//   matmul -> gelu_grad(pre, .) -> sum_to [N] => matmul_dgelu_bgrad (the bias gradient)
//   matmul(dy, x) {ta fold} beside sum_to(dy) [N] => matmul_bgrad (weight and bias gradients)
//   add(x, y) -> layernorm(sum)             => add_layernorm (the sum kept: the residual)
//   layernorm_grad -> add(dres, dx)          => layernorm_grad_add
//   the same with rmsnorm                    => add_rmsnorm, rmsnorm_grad_add
//
// A pattern is fused only where the value it drops (a product, a norm's dx) has no other reader
// and is not an output, and the nodes agree on their pass (forward, backward, recomputed).
// Partitioning has already put any collective between a product and its bias (a row-parallel
// product is all-reduced or reduce-scattered first), so a Partial product never meets a bias here;
// the fused ops' sharding rules refuse it too.
//
//   TS_ASSIGN_OR_RETURN(Partitioned p, partition(g, plan));
//   int fused = 0;
//   TS_RETURN_IF_ERROR(fuse_epilogues(&p, &fused));
#pragma once

#include "parallel/partition.h"

namespace tessera {

// Rewrites p's local graph with the patterns above fused, and remaps every local value and
// node id `p` holds. `fused` (optional): how many fused nodes were made.
Status fuse_epilogues(Partitioned* p, int* fused = nullptr);

}  // namespace tessera
