#include "parallel/pipeline_split.h"

#include <algorithm>
#include <functional>
#include <numeric>

#include "base/check.h"
#include "ir/autodiff.h"
#include "ir/builder.h"

namespace tessera {

std::string pipe_act_name(int chunk, int i) {
  return "pipe.act." + std::to_string(chunk) + "." + std::to_string(i);
}
std::string pipe_grad_name(int chunk, int i) {
  return "pipe.grad." + std::to_string(chunk) + "." + std::to_string(i);
}
bool is_pipeline_input(const std::string& name) {
  return name.rfind("pipe.", 0) == 0 || name.rfind("stash.", 0) == 0;
}

namespace {

// Nodes without inputs (parameters, inputs, fills) are copied into every chunk that reads them.
bool is_leaf(const Node& n) { return n.inputs.empty(); }

// The chunk of each forward node that is not a leaf (-1 for the others).
Result<std::vector<int>> place_nodes(const Graph& g, const std::vector<int>& per_chunk) {
  int blocks = 0;
  for (const Node& n : g.nodes()) blocks = std::max(blocks, n.layer + 1);
  const int total = std::accumulate(per_chunk.begin(), per_chunk.end(), 0);
  if (per_chunk.empty() || total != blocks ||
      std::any_of(per_chunk.begin(), per_chunk.end(), [](int n) { return n < 1; }))
    return error("pipeline: the model has " + std::to_string(blocks) +
                     " blocks, but the chunks hold " + std::to_string(total) + " in " +
                     std::to_string(per_chunk.size()) + " chunks",
                 "give every chunk at least one block, " + std::to_string(blocks) + " in all");
  std::vector<int> chunk_of_block;
  for (size_t c = 0; c < per_chunk.size(); ++c)
    chunk_of_block.insert(chunk_of_block.end(), static_cast<size_t>(per_chunk[c]),
                          static_cast<int>(c));
  const int last = static_cast<int>(per_chunk.size()) - 1;
  std::vector<int> chunk(g.nodes().size(), -1);
  bool seen_block = false;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (in_backward_pass(n) || is_leaf(n)) continue;
    if (n.layer >= 0) {
      seen_block = true;
      chunk[i] = chunk_of_block[static_cast<size_t>(n.layer)];
    } else {
      chunk[i] = seen_block ? last : 0;
    }
  }
  return chunk;
}

}  // namespace

Result<std::vector<ChunkGraph>> split_pipeline(const Graph& g, const std::vector<int>& per_chunk) {
  if (g.loss() < 0 || g.param_grads().empty())
    return error("pipeline: the graph has no loss and gradients",
                 "build the model in ModelMode::train");
  TS_ASSIGN_OR_RETURN(std::vector<int> chunk_of, place_nodes(g, per_chunk));
  const int chunks = static_cast<int>(per_chunk.size());
  std::vector<ChunkGraph> out(static_cast<size_t>(chunks));
  int first = 0;
  for (int c = 0; c < chunks; ++c) {
    out[static_cast<size_t>(c)].first_block = first;
    out[static_cast<size_t>(c)].blocks = per_chunk[static_cast<size_t>(c)];
    first += per_chunk[static_cast<size_t>(c)];
  }

  // Forward: each chunk copies its nodes; a value of the previous chunk becomes an input.
  std::vector<std::vector<ValueId>> map(static_cast<size_t>(chunks),
                                        std::vector<ValueId>(g.values().size(), -1));
  // Values computed from parameters and constants alone (T5's position bias from its table):
  // recomputed in each chunk that reads them rather than sent, since a boundary is split on
  // the batch like an activation.
  const std::vector<char> batch_free = input_free_values(g);
  auto copy_into = [&](int c, const Node& n, std::vector<ValueId> ins) -> Status {
    ChunkGraph& cg = out[static_cast<size_t>(c)];
    Result<NodeId> id = cg.graph.add_node(n.op, n.attrs, std::move(ins), n.scope, n.layer, false);
    if (!id.ok()) return id.status().with_context("pipeline: " + n.scope);
    const Node& made = cg.graph.node(id.value());
    for (size_t k = 0; k < n.outputs.size(); ++k)
      map[static_cast<size_t>(c)][static_cast<size_t>(n.outputs[k])] = made.outputs[k];
    return Status();
  };
  // Makes global value v readable in chunk c: a leaf or batch-free value is (re)computed there;
  // an activation of an earlier chunk arrives through each chunk in between (a chunk passes on
  // what a later one reads: T5's encoder output reaches every decoder chunk).
  // `reader` (the node that needs v) positions a boundary input, as its own inputs are.
  std::function<Status(int, ValueId, const Node&)> reach = [&](int c, ValueId v,
                                                               const Node& reader) -> Status {
    if (map[static_cast<size_t>(c)][static_cast<size_t>(v)] >= 0) return Status();
    const Node& p = g.producer(v);
    const int from = chunk_of[static_cast<size_t>(g.value(v).producer)];
    if (is_leaf(p) || batch_free[static_cast<size_t>(v)]) {
      std::vector<ValueId> ins;
      for (ValueId in : p.inputs) {
        TS_RETURN_IF_ERROR(reach(c, in, reader));
        ins.push_back(map[static_cast<size_t>(c)][static_cast<size_t>(in)]);
      }
      return copy_into(c, p, std::move(ins));
    }
    if (from < 0 || from >= c)
      return error("pipeline: value %" + std::to_string(v) + " of '" + p.scope + "' (chunk " +
                       std::to_string(from) + ") is read in chunk " + std::to_string(c),
                   "a chunk reads values of earlier chunks only; cut the model at other blocks");
    // What crosses a stage boundary is split on the batch like every stage's inputs, but for a
    // scalar summed over the blocks (a mixture of experts' balance loss and kept routes), which
    // every rank of the data axes holds whole (the partition's boundary placements).
    // A chunk that only passes v on holds it outside its blocks (layer -1): the reader's block
    // is a later chunk's.
    Node passing;
    passing.scope = reader.scope;
    passing.layer = -1;
    TS_RETURN_IF_ERROR(reach(c - 1, v, passing));
    ChunkGraph& cg = out[static_cast<size_t>(c)];
    ChunkGraph& prev = out[static_cast<size_t>(c - 1)];
    Builder b(&cg.graph);
    b.set_position(reader.scope, reader.layer);
    Var in = b.input(pipe_act_name(c, static_cast<int>(cg.recv.size())), g.type(v).shape,
                     g.type(v).dtype);
    cg.recv.push_back(in.id);
    prev.send.push_back(map[static_cast<size_t>(c - 1)][static_cast<size_t>(v)]);
    prev.sent_global.push_back(v);
    map[static_cast<size_t>(c)][static_cast<size_t>(v)] = in.id;
    return Status();
  };
  for (int c = 0; c < chunks; ++c) {
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& n = g.nodes()[i];
      // Batch-free nodes are computed where read, by reach().
      if (chunk_of[i] != c || batch_free[static_cast<size_t>(n.outputs[0])]) continue;
      std::vector<ValueId> ins;
      for (ValueId v : n.inputs) {
        TS_RETURN_IF_ERROR(reach(c, v, n));
        ins.push_back(map[static_cast<size_t>(c)][static_cast<size_t>(v)]);
      }
      TS_RETURN_IF_ERROR(copy_into(c, n, std::move(ins)));
    }
  }

  // Backward: from the loss on the last chunk, from the send gradients elsewhere.
  for (int c = 0; c < chunks; ++c) {
    ChunkGraph& cg = out[static_cast<size_t>(c)];
    Builder b(&cg.graph);
    std::vector<GradSeed> seeds;
    for (size_t i = 0; i < cg.send.size(); ++i) {
      const TensorType t = cg.graph.type(cg.send[i]);
      b.set_position("", -1);
      b.set_backward(true);  // read by the backward only
      Var d = b.input(pipe_grad_name(c + 1, static_cast<int>(i)), t.shape, t.dtype);
      b.set_backward(false);
      cg.send_grads.push_back(d.id);
      seeds.push_back({cg.send[i], d.id});
    }
    Var loss;
    if (c == chunks - 1) loss = b.var(map[static_cast<size_t>(c)][static_cast<size_t>(g.loss())]);
    cg.recv_grads = append_backward(b, loss, seeds, cg.recv);
    // The metrics (summed over the blocks: each chunk passes its running sum on) in the chunk
    // that finishes them.
    for (const auto& [name, v] : g.metrics())
      if (chunk_of[static_cast<size_t>(g.value(v).producer)] == c)
        cg.graph.add_metric(name, map[static_cast<size_t>(c)][static_cast<size_t>(v)]);
    for (ValueId v : cg.recv_grads) cg.graph.mark_output(v);
    for (ValueId v : cg.send) cg.graph.mark_output(v);
    TS_RETURN_IF_ERROR(verify(cg.graph));
  }
  return out;
}

std::vector<int> forward_backward_phases(const Graph& g) {
  std::vector<int> phase;
  for (const Node& n : g.nodes()) phase.push_back(in_backward_pass(n) ? 1 : 0);
  return phase;
}

Result<Phases> split_phases(const Graph& g, const std::vector<int>& phase_of_node, int phases) {
  TS_CHECK_EQ(phase_of_node.size(), g.nodes().size());
  Phases p;
  p.graphs.resize(static_cast<size_t>(phases));
  p.value_of.assign(static_cast<size_t>(phases), std::vector<ValueId>(g.values().size(), -1));
  auto copy = [&](int ph, const Node& n, std::vector<ValueId> ins) -> Status {
    Graph& out = p.graphs[static_cast<size_t>(ph)];
    Result<NodeId> id =
        out.add_node(n.op, n.attrs, std::move(ins), n.scope, n.layer, n.backward, n.recompute);
    if (!id.ok()) return id.status().with_context("split_phases: " + n.scope);
    const Node& made = out.node(id.value());
    for (size_t k = 0; k < n.outputs.size(); ++k)
      p.value_of[static_cast<size_t>(ph)][static_cast<size_t>(n.outputs[k])] = made.outputs[k];
    return Status();
  };
  std::vector<int> phase_of_value(g.values().size(), -1);
  // Every parameter in every phase, in the split graph's order.
  for (ValueId v : g.params())
    for (int ph = 0; ph < phases; ++ph) TS_RETURN_IF_ERROR(copy(ph, g.producer(v), {}));
  // Fills and axis_index: recomputed in each phase that reads them.
  auto shared_leaf = [](const Node& n) { return n.inputs.empty() && n.op != OpKind::input; };
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.op == OpKind::parameter || shared_leaf(n)) continue;
    const int ph = phase_of_node[i];
    TS_CHECK(ph >= 0 && ph < phases) << "split_phases: node " << i << " phase " << ph;
    std::vector<ValueId> ins;
    for (ValueId v : n.inputs) {
      ValueId& here = p.value_of[static_cast<size_t>(ph)][static_cast<size_t>(v)];
      if (here < 0) {
        const Node& prod = g.producer(v);
        const int from = phase_of_value[static_cast<size_t>(v)];
        if (shared_leaf(prod)) {
          TS_RETURN_IF_ERROR(copy(ph, prod, {}));
        } else if (from >= 0 && from < ph) {
          Graph& dst = p.graphs[static_cast<size_t>(ph)];
          Builder b(&dst);
          b.set_position(n.scope, n.layer);
          b.set_backward(n.backward);
          const std::string name =
              "stash." + std::to_string(from) + "." + std::to_string(p.stash.size());
          const ValueId in = b.input(name, g.type(v).shape, g.type(v).dtype).id;
          const ValueId out = p.value_of[static_cast<size_t>(from)][static_cast<size_t>(v)];
          p.graphs[static_cast<size_t>(from)].mark_output(out);
          p.stash.push_back({from, out, ph, in});
          here = in;
        } else {
          return error("split_phases: '" + n.scope + "' (phase " + std::to_string(ph) +
                       ") reads a value of phase " + std::to_string(from));
        }
      }
      ins.push_back(here);
    }
    TS_RETURN_IF_ERROR(copy(ph, n, std::move(ins)));
    for (ValueId v : n.outputs) phase_of_value[static_cast<size_t>(v)] = ph;
  }
  auto home = [&](ValueId v, int* ph) {
    *ph = phase_of_value[static_cast<size_t>(v)];
    return p.value_of[static_cast<size_t>(*ph)][static_cast<size_t>(v)];
  };
  for (ValueId v : g.outputs()) {
    if (v == g.loss()) continue;
    if (shared_leaf(g.producer(v))) {  // a constant (a zero gradient): made in every phase
      for (int k = 0; k < phases; ++k) {
        ValueId& here = p.value_of[static_cast<size_t>(k)][static_cast<size_t>(v)];
        if (here < 0) TS_RETURN_IF_ERROR(copy(k, g.producer(v), {}));
        p.graphs[static_cast<size_t>(k)].mark_output(here);
      }
      continue;
    }
    int ph = 0;
    const ValueId c = home(v, &ph);
    p.graphs[static_cast<size_t>(ph)].mark_output(c);
  }
  if (g.loss() >= 0) {
    int ph = 0;
    const ValueId c = home(g.loss(), &ph);
    p.graphs[static_cast<size_t>(ph)].set_loss(c);
  }
  for (const auto& [name, v] : g.metrics()) {  // in the phase computing each
    int ph = 0;
    const ValueId c = home(v, &ph);
    p.graphs[static_cast<size_t>(ph)].add_metric(name, c);
  }
  for (auto [param, grad] : g.param_grads()) {
    int ph = 0;
    const ValueId c = home(grad, &ph);
    p.graphs[static_cast<size_t>(ph)].set_param_grad(
        p.value_of[static_cast<size_t>(ph)][static_cast<size_t>(param)], c);
  }
  for (const Graph& out : p.graphs) TS_RETURN_IF_ERROR(verify(out));
  return p;
}

}  // namespace tessera
