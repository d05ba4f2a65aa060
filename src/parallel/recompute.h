// Activation recomputation (gradient checkpointing) as a graph pass: the backward pass of each
// transformer block reads a recomputed copy of the block's forward instead of the activations
// the forward pass produced, so the memory planner frees those right after the forward pass
// and only each block's input (the residual stream) stays alive until the block's backward.
//
//   ModelGraph m = build_model(cfg, batch, seq, ModelMode::train);
//   TS_ASSIGN_OR_RETURN(Graph g, apply_recompute(m.graph, RecomputePolicy::full));
//   plan_memory(g).arena_bytes < plan_memory(m.graph).arena_bytes;   // several layers
//   g.total_flops() ~= m.graph.total_flops() + forward FLOPs of the blocks
//
// Under RecomputePolicy::selective only the cheap ops are cloned: the closure stops at matmul
// and attention nodes, whose outputs the clones and the backward read where the forward left
// them (a few percent more FLOPs; the norms', activations' and reshapes' outputs are freed).
//
// lower(g, plan) applies it when plan.recompute is not none. How it works: for each layer L, the
// forward values of L (produced by non-source forward nodes tagged layer L) that the backward
// nodes of L read are collected, together with the forward nodes of L they depend on, up to
// the block's inputs (values of other layers), parameters, inputs and fills. Clones of those
// nodes, marked Node::recompute (backward stays false), are inserted in their original order
// immediately before the first backward node of L that reads one of them; the backward nodes
// of L then read the clones. Every forward node keeps its ValueId (clones come after the
// forward pass), so parameters, inputs, the loss and the logits keep theirs; gradients and
// other backward values are renumbered (see `value_map`). Applying the pass twice changes
// nothing: clones are never cloned again.
#pragma once

#include <vector>

#include "ir/graph.h"
#include "parallel/plan.h"

namespace tessera {

// `g` must be a training graph (append_backward); with RecomputePolicy::none it is copied
// unchanged. `layers` >= 0 applies the policy to blocks 0 .. layers-1 only (the others keep
// their activations); -1 to every block; more than the graph's blocks is an error. When `value_map`
// is given it receives, for each value of `g`, its id in the result. The result verifies and keeps
// g's parameters, inputs, loss, outputs and gradients.
Result<Graph> apply_recompute(const Graph& g, RecomputePolicy policy,
                              std::vector<ValueId>* value_map = nullptr, int layers = -1);

}  // namespace tessera
