// The mixture-of-experts MLP (Mixtral: Jiang et al. 2024; the routing of Switch Transformer,
// Fedus et al. 2022, and GShard, Lepikhin et al. 2021), written with the builder and the
// routing ops of ir/ops_moe.cc.
#include <algorithm>
#include <cmath>

#include "models/blocks.h"
#include "models/model.h"

namespace tessera {

int64_t ModelConfig::expert_capacity(int64_t examples, int64_t tokens) const {
  if (!is_moe()) return 0;
  // Per example (so that a batch split over ranks splits the slots evenly), at most every token.
  const double share = capacity_factor * static_cast<double>(tokens * experts_per_token) /
                       static_cast<double>(n_experts);
  const int64_t per_example =
      std::clamp<int64_t>(static_cast<int64_t>(std::ceil(share - 1e-9)), 1, tokens);
  return examples * per_example;
}

MoeOutputs moe_mlp(Builder& b, const ModelConfig& c, Var x) {
  const Shape xs = x.shape();  // [B, T, C]
  const int64_t C = c.n_embd, F = c.ffn(), E = c.n_experts, K = c.experts_per_token;
  const int64_t N = xs[0] * xs[1];
  const MoeAttrs route{.experts = E, .capacity = c.expert_capacity(xs[0], xs[1])};
  const double proj_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  Var h = b.reshape(x, Shape{N, C});

  // Router: the k largest logits of each token, their softmax the experts' weights.
  Var logits;
  {
    auto s = b.scope("router");
    logits = b.linear(h, b.parameter("weight", Shape{E, C}, Init::normal, c.init_std));
  }
  std::vector<Var> top = b.op<OpKind::top_k>({logits}, {.k = K});
  Var weights = b.softmax(top[0]);
  Var slots = b.op<OpKind::moe_slots>({top[1]}, route)[0];

  // The experts, as batched matmuls over their buffers of token slots.
  Var y;
  {
    auto s = b.scope("experts");
    Var buf = b.op<OpKind::moe_dispatch>({h, slots}, route)[0];  // [E, cap, C]
    Var gate = b.expert_parameter("gate", Shape{E, F, C}, Init::normal, c.init_std);
    Var up = b.expert_parameter("up", Shape{E, F, C}, Init::normal, c.init_std);
    Var down = b.expert_parameter("down", Shape{E, C, F}, Init::normal, proj_std);
    Var a = b.swiglu(b.matmul(buf, gate, false, true), b.matmul(buf, up, false, true));
    y = b.op<OpKind::moe_combine>({b.matmul(a, down, false, true), slots, weights}, route)[0];
  }

  MoeOutputs out;
  out.y = b.reshape(y, xs);
  // Load balancing (Switch Transformer eq. 4, Hugging Face Mixtral's form): E x sum over
  // experts of the routes sent to it per token (summing to k) times its mean router
  // probability. The routes count the top-k picks (constant: no gradient); the probability
  // carries the gradient to the router.
  auto s = b.scope("balance");
  const double per_token = 1.0 / static_cast<double>(N);
  Var picked = b.op<OpKind::top_k_grad>({b.fill(Shape{N, K}, 1.0, logits.dtype()), top[1]},
                                        {.k = K, .n = E})[0];  // [N, E] ones where picked
  Var fraction = b.scale(b.reduce_sum(picked, {0}), per_token);
  Var prob = b.scale(b.reduce_sum(b.softmax(logits), {0}), per_token);
  out.aux = b.scale(b.reduce_sum(fraction * prob, {0}), static_cast<double>(E));
  // The routes that found a slot: the slots a dispatch of ones fills.
  Var kept = b.op<OpKind::moe_dispatch>({b.fill(Shape{N, 1}, 1.0), slots}, route)[0];
  out.kept = b.reduce_sum(kept, {0, 1, 2});
  return out;
}

}  // namespace tessera
