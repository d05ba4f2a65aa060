// CPU kernels (f32 compute; i32 for ids/targets). One function per op family; the dispatcher in
// cpu_backend.cc maps each OpKind to one of them and converts bf16/f16 storage to f32.
#pragma once

#include <span>
#include <vector>

#include "ir/graph.h"

namespace tessera::cpu {

struct Args {
  const Attrs& attrs;
  std::span<const TensorType> in_types;
  std::span<const TensorType> out_types;
  std::vector<const void*> in;
  std::vector<void*> out;

  const float* fin(int i) const { return static_cast<const float*>(in[static_cast<size_t>(i)]); }
  const int32_t* iin(int i) const {
    return static_cast<const int32_t*>(in[static_cast<size_t>(i)]);
  }
  float* fout(int i) const { return static_cast<float*>(out[static_cast<size_t>(i)]); }
  const Shape& in_shape(int i) const { return in_types[static_cast<size_t>(i)].shape; }
  const Shape& out_shape(int i) const { return out_types[static_cast<size_t>(i)].shape; }
};

// kernels_elementwise.cc
void fill(const Args& a);
void binary(OpKind op, const Args& a);  // add, sub, mul, div with broadcasting
void unary(OpKind op, const Args& a);  // scale, add_scalar, exp, log, sqrt, rsqrt, tanh, gelu, silu
void gelu_grad(const Args& a);
void silu_grad(const Args& a);
void swiglu(const Args& a);
void swiglu_grad(const Args& a);

// kernels_shape.cc
void reduce_sum(const Args& a);
void sum_to(const Args& a);
void broadcast_to(const Args& a);
void copy(const Args& a);  // reshape
void transpose(const Args& a);
void slice(const Args& a);
void concat(const Args& a);

// kernels_matmul.cc
void matmul(const Args& a);

// kernels_nn.cc
void embedding(const Args& a);
void embedding_grad(const Args& a);
void layernorm(const Args& a);
void layernorm_grad(const Args& a);
void rmsnorm(const Args& a);
void rmsnorm_grad(const Args& a);
void rope(const Args& a);
void softmax(const Args& a);
void softmax_grad(const Args& a);
void causal_mask(const Args& a);
void cross_entropy(const Args& a);
void cross_entropy_grad(const Args& a);

// kernels_attention.cc
void attention(const Args& a);
void attention_grad(const Args& a);

}  // namespace tessera::cpu
