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

}  // namespace tessera
