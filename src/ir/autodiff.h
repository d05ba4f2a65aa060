// Reverse-mode autodiff: appends to the graph the nodes that compute the gradient of a scalar
// loss w.r.t. every parameter, each built from the ops' VJPs and tagged backward with the scope
// and layer of the forward node it differentiates.
//
//   Var loss = model.forward(b, tokens, targets);
//   append_backward(b, loss);
//   for (auto [param, grad] : g.param_grads()) ...
#pragma once

#include "ir/builder.h"

namespace tessera {

// Sets g.loss() and g.param_grads() (a zero gradient for parameters that do not reach the loss).
void append_backward(Builder& b, Var loss);

// The backward pass of one piece of a model (a pipeline stage, parallel/pipeline_split.h):
// the gradient flows from `loss` (when valid) and from each seed's `grad`, the gradient of
// forward value `value` supplied from outside (an input); `wrt` names non-parameter values
// (the stage's received activations) whose gradients are wanted too. Sets g.param_grads() and,
// when the loss is valid, g.loss(); returns the gradient of each `wrt` value, in order (a zero
// fill where none reaches it).
struct GradSeed {
  ValueId value = -1;
  ValueId grad = -1;
};
std::vector<ValueId> append_backward(Builder& b, Var loss, const std::vector<GradSeed>& seeds,
                                     const std::vector<ValueId>& wrt);

}  // namespace tessera
