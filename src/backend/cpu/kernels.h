// CPU kernels (f32 compute; i32 for ids/targets). One function per op family; each
// kernels_*.cc file registers its kernels for their ops in a KernelTable (no central dispatch
// switch: adding an op's kernel touches its kernel file alone), and cpu_backend.cc runs the
// table's entry, converting bf16/f16 storage to f32 around it.
//
//   void register_my_kernels(KernelTable& t) { t.add(OpKind::my_op, [](OpKind, const Args& a)
//   {...}); }
#pragma once

#include <array>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "ir/graph.h"

namespace tessera::cpu {

using Args = KernelArgs;  // backend/backend.h

// Which kernel runs each op (null: none; CpuBackend::supports says no).
using KernelFn = void (*)(OpKind op, const Args& a);
struct KernelTable {
  std::array<KernelFn, kNumOps> fns{};
  void add(OpKind op, KernelFn fn) { fns[static_cast<size_t>(op)] = fn; }
  KernelFn at(OpKind op) const { return fns[static_cast<size_t>(op)]; }
};
void register_elementwise_kernels(KernelTable& t);  // kernels_elementwise.cc
void register_shape_kernels(KernelTable& t);        // kernels_shape.cc
void register_matmul_kernels(KernelTable& t);       // kernels_matmul.cc
void register_nn_kernels(KernelTable& t);           // kernels_nn.cc
void register_attention_kernels(KernelTable& t);    // kernels_attention.cc
void register_moe_kernels(KernelTable& t);          // kernels_moe.cc

// kernels_elementwise.cc
void fill(const Args& a);
void binary(OpKind op, const Args& a);  // add, sub, mul, div with broadcasting
void unary(OpKind op,
           const Args& a);  // scale, add_scalar, exp, log, sqrt, rsqrt, tanh, gelu, silu, relu
void gelu_grad(const Args& a);
void silu_grad(const Args& a);
void relu_grad(const Args& a);
void swiglu(const Args& a);
void swiglu_grad(const Args& a);

// kernels_shape.cc
void reduce_sum(const Args& a);
void sum_to(const Args& a);
// Sums x (shape `in`) into y (shape `kept`: in's rank, 1 where summed); sum_to's arithmetic.
void reduce_into(const float* x, const Shape& in, float* y, const Shape& kept);
void broadcast_to(const Args& a);
void copy(const Args& a);  // reshape
void transpose(const Args& a);
void slice(const Args& a);
void shard_slice(const Args& a);  // slice at block in(1) of ShardSliceAttrs::blocks
void concat(const Args& a);

// kernels_matmul.cc
void matmul(const Args& a);
void matmul_bias(const Args& a);  // the fused epilogues of ir/ops_fused.cc
void matmul_bias_gelu(const Args& a);
void matmul_dgelu_bgrad(const Args& a);
void matmul_bgrad(const Args& a);
// C[m,n] = op(A) op(B) + beta C, row-major, split over the backend's threads (OpenBLAS
// single-threaded inside each); ld* are the row strides of A, B, C as stored.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda,
           const float* B, int64_t ldb, float* C, int64_t ldc, float beta);

// kernels_nn.cc
void embedding(const Args& a);
void embedding_grad(const Args& a);
void vocab_embedding(const Args& a);  // ops_vocab.cc: the shard index is an i32 input
void vocab_embedding_grad(const Args& a);
void layernorm(const Args& a);
void layernorm_grad(const Args& a);
void add_layernorm(const Args& a);  // the fused residual norms of ir/ops_fused.cc
void layernorm_grad_add(const Args& a);
void add_rmsnorm(const Args& a);
void rmsnorm_grad_add(const Args& a);
void rmsnorm(const Args& a);
void rmsnorm_grad(const Args& a);
void rope(const Args& a);
void softmax(const Args& a);
void softmax_grad(const Args& a);
void causal_mask(const Args& a);
void cross_entropy(const Args& a);
void cross_entropy_grad(const Args& a);
void vocab_cross_entropy_grad(const Args& a);
void vocab_pick(const Args& a);
void logsumexp(const Args& a);
void vocab_logsumexp(const Args& a);

// kernels_attention.cc
void position_buckets(const Args& a);
void attention(const Args& a);
void attention_grad(const Args& a);
void attention_merge(const Args& a);

// kernels_optim.cc: flat f32 passes of the optimizer (CpuBackend's sum_squares, adamw, ...).
// AdamWUpdate (backend/backend.h):
void adamw_update(const AdamWUpdate& u, float* param, const float* grad, float* m, float* v,
                  int64_t n);
// Sum of x^2 in double over fixed chunks added in order (the same whatever the thread count).
double sum_squares(const float* x, int64_t n);
void scale_inplace(float* x, int64_t n, float c);
void add_inplace(float* dst, const float* src, int64_t n);
void copy_floats(float* dst, const float* src, int64_t n);

}  // namespace tessera::cpu
