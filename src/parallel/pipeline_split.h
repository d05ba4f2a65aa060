// Cuts a training graph into pipeline model chunks: each chunk is a training graph of its own
// (its blocks' forward, then their backward), which the runtime runs once per micro-batch per
// schedule action and the simulator times. Boundaries are explicit values:
//
//   TS_ASSIGN_OR_RETURN(std::vector<int> per_chunk, balance_stages(costs, 4));
//   TS_ASSIGN_OR_RETURN(std::vector<ChunkGraph> chunks, split_pipeline(model.graph, per_chunk));
//   chunks[c].recv       // inputs "pipe.act.c.i": activations sent by chunk c-1 (its send[i])
//   chunks[c].recv_grads // outputs: their gradients, sent back to chunk c-1 (its send_grads[i])
//   chunks[c].send       // forward values chunk c+1 reads
//   chunks[c].send_grads // inputs "pipe.grad.c+1.i": the gradients of send[i], from chunk c+1
//
// Node placement follows pipeline_stages.h: a node of block l goes to the chunk holding block
// l; a forward node outside the blocks goes to chunk 0 when it precedes the first block (the
// embedding), to the last chunk otherwise (final norm, head, loss). Parameters and inputs are
// copied into every chunk that reads them: a parameter read by two chunks (GPT-2's tied wte, on
// the first and the last) has a gradient in each, and the model's gradient is their sum.
// A value computed from parameters and constants alone (T5's position bias, from its table and
// the buckets) is computed in each chunk that reads it, its table then read by several chunks
// like the tied wte. An activation read by a chunk after the next (T5's encoder output, read by
// every decoder block) passes through the chunks in between: each receives it and sends it on.
// Each chunk's backward is built by autodiff from its loss (the last chunk) and its send
// gradients, so recomputation and partitioning apply to a chunk as to a whole model.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "ir/graph.h"

namespace tessera {

struct ChunkGraph {
  Graph graph;  // training graph; loss() set on the last chunk only
  int first_block = 0, blocks = 0;
  std::vector<ValueId> recv;        // inputs (empty on chunk 0)
  std::vector<ValueId> recv_grads;  // outputs, one per recv
  std::vector<ValueId> send;        // forward outputs (empty on the last chunk)
  std::vector<ValueId> send_grads;  // inputs, one per send
  // Graph values that back the boundaries, for naming and tests: send[i] is global value
  // sent_global[i] of the graph that was split.
  std::vector<ValueId> sent_global;
};

// `g` must be a training graph (append_backward) with blocks 0..n-1 (Node::layer); per_chunk
// gives each chunk's number of blocks (pipeline_stages.h), in order. Errors name the value that
// cannot cross (a value read two or more chunks after the one producing it).
Result<std::vector<ChunkGraph>> split_pipeline(const Graph& g, const std::vector<int>& per_chunk);

// A graph cut into phases run at different times: a pipeline schedule runs the forward of
// several micro-batches before their backwards, and zb-h1 defers the weight gradients further.
// `phase_of_node` gives each node's phase; a node reads values of its own or earlier phases.
// A value read by a later phase is stashed: an output of its phase and an input
// "stash.<from>.<k>" of the reading one, kept per micro-batch in flight. Every parameter is in
// every phase (the phases' executors share them by name: Executor's params_of); other nodes
// without inputs (fills, axis_index) are copied into each phase that reads them. Outputs, the
// loss and the parameter gradients go to the phases computing them.
//
//   TS_ASSIGN_OR_RETURN(Phases ph, split_phases(g, forward_backward_phases(g), 2));
//   ph.graphs[1]                  // the backward, reading ph.stash[k].in = ph.stash[k].out of 0
struct Phases {
  struct Stash {
    int from = 0;      // phase producing the value
    ValueId out = -1;  // ... where it is an output
    int to = 0;        // phase reading it
    ValueId in = -1;   // ... where it is an input
  };
  std::vector<Graph> graphs;
  std::vector<std::vector<ValueId>> value_of;  // [phase][value of g]: its copy there, or -1
  std::vector<Stash> stash;
};
Result<Phases> split_phases(const Graph& g, const std::vector<int>& phase_of_node, int phases);
// Phase 0 for forward nodes, 1 for the backward pass's (in_backward_pass).
std::vector<int> forward_backward_phases(const Graph& g);

// Name of the i-th activation chunk c receives, and of its gradient.
std::string pipe_act_name(int chunk, int i);
std::string pipe_grad_name(int chunk, int i);
// Whether a chunk graph's input is one the pipeline itself fills (an activation or gradient
// received from a neighbour, a value stashed between phases), not a model input.
bool is_pipeline_input(const std::string& name);

}  // namespace tessera
