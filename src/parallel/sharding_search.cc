#include "parallel/sharding_search.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>

#include "parallel/partition.h"

namespace tessera {

namespace {

// Parameters of block `layer`, in graph order.
std::vector<ValueId> block_params(const Graph& g, int layer) {
  std::vector<ValueId> out;
  for (ValueId p : g.params())
    if (g.producer(p).layer == layer) out.push_back(p);
  return out;
}

// A parameter's name with its block number taken out: "h.#.attn.qkv.weight" for
// "h.3.attn.qkv.weight", the same in every block of one kind (T5's encoder blocks, its
// decoder blocks).
std::string kind_name(const std::string& name) {
  std::string out, part;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i < name.size() && name[i] != '.') {
      part += name[i];
      continue;
    }
    const bool number = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    out += (out.empty() ? "" : ".") + (number ? std::string("#") : part);
    part.clear();
  }
  return out;
}

// The kind names of a block's parameters, in order.
std::vector<std::string> signature(const Graph& g, const std::vector<ValueId>& ps) {
  std::vector<std::string> out;
  for (ValueId p : ps) out.push_back(kind_name(g.name_of(p)));
  return out;
}

struct Score {
  bool ok = false;
  Status why;  // the partition error when not ok
  double cost = 0, flops = 0, tensor_bytes = 0, param_bytes = 0, state_bytes = 0;
  bool fits = true;  // state_bytes within the budget
  bool better_than(const Score& o) const {
    if (!o.ok) return ok;
    if (!ok) return false;
    if (fits != o.fits) return fits;
    // Neither fits: the one that holds less.
    if (!fits && state_bytes != o.state_bytes) return state_bytes < o.state_bytes;
    if (cost != o.cost) return cost < o.cost;
    return param_bytes < o.param_bytes;
  }
};

// Why a parameter outside the blocks stays whole: rows the degree does not divide. For a
// vocabulary, the padded size that would let it split (a multiple of 128 and of the degree).
std::string vocab_note(const std::string& name, const Shape& shape, int64_t vocab, int degree,
                       const std::string& axis) {
  std::string s = name + " " + shape.to_string() + " stays Replicate: its " +
                  std::to_string(shape[0]) + " rows do not split over " + axis + " " +
                  std::to_string(degree);
  if (shape[0] != vocab) return s;
  const int64_t m = std::lcm<int64_t>(128, degree);
  return s + "; padded_vocab_size = " + std::to_string((vocab + m - 1) / m * m) +
         " in the model's TOML would make it vocab-parallel";
}

Score evaluate(const Graph& g, const Plan& plan, const SearchCost& c) {
  Score s;
  Result<Partitioned> part = partition(g, plan);
  if (!part.ok()) {
    s.why = part.status();
    return s;
  }
  const Graph& l = part->local;
  for (const Node& n : l.nodes()) {
    std::vector<TensorType> in, out;
    for (ValueId v : n.inputs) in.push_back(l.type(v));
    for (ValueId v : n.outputs) out.push_back(l.type(v));
    if (!is_collective(n.op)) {
      s.flops += op_flops(n.op, n.attrs, in, out);
      continue;
    }
    bool tensor = false;
    for (const std::string& a : axes_of_key(n.attr<GroupAttrs>().axes))
      tensor = tensor || std::count(plan.tensor_axes.begin(), plan.tensor_axes.end(), a);
    if (tensor) s.tensor_bytes += op_bytes(n.op, n.attrs, in, out);
  }
  // The searched graph's blocks (one of each kind: T5's encoder and decoder) stand for the
  // blocks the rank holds, shared among the kinds.
  std::set<int> kinds;
  for (const ParamLayout& p : part->params)
    if (g.producer(p.global).layer >= 0) kinds.insert(g.producer(p.global).layer);
  const double per_kind = kinds.empty() ? 1.0 : c.blocks / static_cast<double>(kinds.size());
  for (const ParamLayout& p : part->params) {
    const double elems = static_cast<double>(p.local_shape.numel());
    s.param_bytes += 4.0 * elems;
    const bool in_block = g.producer(p.global).layer >= 0;
    s.state_bytes += elems * c.state_bytes_per_element * (in_block ? per_kind : 1.0);
  }
  s.fits = c.state_budget_bytes <= 0 || s.state_bytes <= c.state_budget_bytes;
  s.cost = s.flops + c.flops_per_byte * s.tensor_bytes;
  s.ok = true;
  return s;
}

// The plan with block 0's placements applied to every block of g (whose blocks the search
// has checked alike).
Plan with_block(const Plan& plan, const Graph& g, const BlockLayout& b) {
  Plan p = plan;
  p.params = expand_block_layout(b, g, plan).value();
  return p;
}

}  // namespace

Result<std::map<std::string, std::vector<Placement>>> expand_block_layout(const BlockLayout& b,
                                                                          const Graph& g,
                                                                          const Plan& plan) {
  std::map<std::string, std::vector<Placement>> out = plan.params;
  auto place = [&](const std::string& name, const std::vector<Placement>& p) {
    const bool replicated =
        std::all_of(p.begin(), p.end(), [](const Placement& x) { return x.is_replicate(); });
    if (replicated)
      out.erase(name);
    else
      out[name] = p;
  };
  for (size_t i = 0; i < b.outer_names.size(); ++i) place(b.outer_names[i], b.outer_placements[i]);
  std::map<std::string, size_t> searched;  // kind name -> index in b.names
  for (size_t i = 0; i < b.names.size(); ++i) searched.emplace(kind_name(b.names[i]), i);
  for (int layer = 0;; ++layer) {
    std::vector<ValueId> ps = block_params(g, layer);
    if (ps.empty()) break;
    for (ValueId p : ps) {
      auto at = searched.find(kind_name(g.name_of(p)));
      if (at == searched.end())
        return error("sharding search: parameter " + g.name_of(p) + " of block " +
                         std::to_string(layer) + " is in no block searched",
                     "search on a graph with a block of each kind the model has (a one-layer "
                     "model of the same config)");
      place(g.name_of(p), b.placements[at->second]);
    }
  }
  return out;
}

Result<BlockLayout> search_block_layout(const Graph& g, const Plan& plan, const SearchCost& c) {
  TS_RETURN_IF_ERROR(validate(plan));
  if (plan.tensor_axes.size() != 1)
    return error("sharding search: the plan needs exactly one tensor axis, it has " +
                 std::to_string(plan.tensor_axes.size()));
  const size_t tp = static_cast<size_t>(plan.mesh.axis_index(plan.tensor_axes[0]));
  // The first block of each kind (GPT: one; T5: an encoder and a decoder block), searched one
  // kind after another, the others at their best placements so far.
  BlockLayout b;
  std::vector<ValueId> ps;  // the parameters b.names names
  std::vector<std::vector<std::string>> seen;
  const std::vector<Placement> rep(plan.mesh.axes().size(), Placement::replicate());
  for (int layer = 0;; ++layer) {
    std::vector<ValueId> lp = block_params(g, layer);
    if (lp.empty()) break;
    std::vector<std::string> sig = signature(g, lp);
    if (std::find(seen.begin(), seen.end(), sig) != seen.end()) continue;
    seen.push_back(std::move(sig));
    b.kind_sizes.push_back(lp.size());
    for (ValueId p : lp) {
      ps.push_back(p);
      b.names.push_back(g.name_of(p));
      b.placements.push_back(rep);
    }
  }
  if (ps.empty()) return error("sharding search: the graph has no transformer block 0");
  TS_RETURN_IF_ERROR(expand_block_layout(b, g, plan).status());
  // Sharded candidates the shapes took, and the first refusal (reported when none did).
  int sharded_ok = 0;
  Status refusal;
  auto tried = [&](const Score& s) {
    ++b.candidates;
    if (s.ok) ++sharded_ok;
    if (!s.ok && refusal.ok()) refusal = s.why;
    return s;
  };

  // A vector's module: "h.0.attn.qkv" for "h.0.attn.qkv.bias".
  auto module_of = [&](size_t i) {
    const std::string& n = b.names[i];
    return n.substr(0, n.rfind('.'));
  };
  // A candidate's matrices fixed, its vectors (of the kind searched) greedily: each starts as
  // its module's matrix when that is column-split (a bias follows its matrix: several
  // column-split modules need all their biases split at once) and is flipped, one at a time,
  // where that lowers the cost.
  auto score = [&](BlockLayout* cand, bool sharded, const std::vector<size_t>& matrices,
                   const std::vector<size_t>& vectors) {
    for (size_t v : vectors) {
      Placement follow = Placement::replicate();
      for (size_t m : matrices)
        if (module_of(m) == module_of(v) && cand->placements[m][tp] == Placement::shard(0) &&
            g.type(ps[m]).shape[0] == g.type(ps[v]).shape[0])
          follow = Placement::shard(0);
      cand->placements[v][tp] = follow;
    }
    Score s = evaluate(g, with_block(plan, g, *cand), c);
    if (sharded) tried(s);
    for (size_t v : vectors) {
      BlockLayout alt = *cand;
      alt.placements[v][tp] =
          alt.placements[v][tp].is_replicate() ? Placement::shard(0) : Placement::replicate();
      Score t = tried(evaluate(g, with_block(plan, g, alt), c));
      // Only for a lower cost: a norm weight split to save its few bytes would be gathered
      // before every use.
      if (t.ok && (!s.ok || (t.cost < s.cost && (t.fits || !s.fits)))) {
        s = t;
        *cand = alt;
      }
    }
    return s;
  };
  BlockLayout best_b = b;
  Score best;
  const Placement choices[] = {Placement::replicate(), Placement::shard(0), Placement::shard(1)};
  for (size_t k = 0, start = 0; k < b.kind_sizes.size(); start += b.kind_sizes[k++]) {
    std::vector<size_t> matrices, vectors;
    for (size_t i = start; i < start + b.kind_sizes[k]; ++i)
      (g.type(ps[i]).shape.rank() >= 2 ? matrices : vectors).push_back(i);
    {
      BlockLayout cand = best_b;
      Score s = score(&cand, false, matrices, vectors);
      ++b.candidates;
      if (k == 0 || s.better_than(best)) {
        best = s;
        best_b = cand;
      }
    }
    // Matrices: every combination of R, S(0), S(1) when there are at most 3^4 (GPT's block);
    // more (LLaMA's 7, T5's decoder block's 10) are searched a module at a time ("...cross"
    // of "...cross.q.weight"), every combination of its matrices with the others fixed,
    // twice over the modules.
    std::vector<std::vector<size_t>> groups;
    if (matrices.size() <= 4) {
      groups.push_back(matrices);
    } else {
      std::vector<std::string> keys;
      for (size_t m : matrices) {
        const std::string mod = module_of(m), key = mod.substr(0, mod.rfind('.'));
        auto at = std::find(keys.begin(), keys.end(), key);
        if (at == keys.end()) {
          keys.push_back(key);
          groups.emplace_back();
          at = keys.end() - 1;
        }
        groups[static_cast<size_t>(at - keys.begin())].push_back(m);
      }
    }
    const bool grouped = groups.size() > 1;
    for (int pass = 0; pass < (grouped ? 2 : 1); ++pass)
      for (const std::vector<size_t>& group : groups) {
        const BlockLayout base = best_b;
        std::vector<int> pick(group.size(), 0);
        for (bool first = true;; first = false) {
          // The all-Replicate pick is the baseline above, except module by module (where the
          // module's placements may have moved since).
          if (!(first && grouped)) {
            size_t i = 0;
            while (i < pick.size() && ++pick[i] == 3) pick[i++] = 0;
            if (i == pick.size()) break;
          }
          BlockLayout cand = base;
          for (size_t q = 0; q < group.size(); ++q)
            cand.placements[group[q]][tp] = choices[pick[q]];
          // Module by module, a pick of all Replicate may still hold earlier modules' splits.
          bool sharded = false;
          for (size_t q : matrices) sharded = sharded || !cand.placements[q][tp].is_replicate();
          Score s = score(&cand, sharded, matrices, vectors);
          if (s.better_than(best)) {
            best = s;
            best_b = cand;
          }
        }
      }
  }
  if (!best.ok) return best.why.with_context("sharding search, every block Replicate");
  if (sharded_ok == 0)
    return error("sharding search: no parameter of a block can be sharded " +
                     std::to_string(plan.tensor_group()) + " ways over " + plan.tensor_axes[0] +
                     "; for example, " + refusal.message(),
                 refusal.hint().empty() ? "use a smaller tensor-parallel degree" : refusal.hint());

  // Outside the blocks: each matrix tries Shard(0) and Shard(1) with the block chosen.
  Plan outer = with_block(plan, g, best_b);
  const int degree = plan.tensor_group();
  int64_t vocab = 0;  // the logits' columns
  for (const Node& n : g.nodes())
    if (n.op == OpKind::cross_entropy) vocab = g.type(n.inputs[0]).shape[-1];
  for (ValueId p : g.params()) {
    if (g.producer(p).layer >= 0) continue;
    const std::string& name = g.name_of(p);
    const Shape& shape = g.type(p).shape;
    if (shape.rank() >= 2) {
      for (Placement choice : {Placement::shard(0), Placement::shard(1)}) {
        Plan alt = outer;
        alt.params[name] = rep;
        alt.params[name][tp] = choice;
        Score s = tried(evaluate(g, alt, c));
        if (s.better_than(best)) {
          best = s;
          outer = alt;
        }
      }
      if (outer.placements_of(name)[tp].is_replicate() && shape[0] % degree != 0)
        best_b.notes.push_back(vocab_note(name, shape, vocab, degree, plan.tensor_axes[0]));
    }
    best_b.outer_names.push_back(name);
    best_b.outer_placements.push_back(outer.placements_of(name));
  }
  best_b.cost = best.cost;
  best_b.state_bytes = best.state_bytes;
  best_b.fits = best.fits;
  best_b.local_flops = best.flops;
  best_b.tensor_bytes = best.tensor_bytes;
  best_b.candidates = b.candidates;
  return best_b;
}

double state_bytes_per_element(const Plan& plan, DType dtype) {
  const double group = plan.zero_group();
  const double param = dtype_size(dtype);
  const double grad = plan.micro_batches > 1 ? 4.0 : param;  // else it lives in the arena
  // An offloaded optimizer keeps its state (and the f32 masters) in host memory.
  const double optim = plan.offloads_optimizer() ? 0.0 : dtype == DType::f32 ? 8.0 : 12.0;
  return (plan.offloads_params() ? 0.0 : param / (plan.zero >= 3 ? group : 1)) +
         grad / (plan.zero >= 2 ? group : 1) + optim / (plan.zero >= 1 ? group : 1);
}

Result<BlockLayout> place_tensor_parallel(const ModelConfig& cfg, int64_t batch, int64_t seq,
                                          const Graph& full, const SearchCost& cost, Plan* plan) {
  ModelConfig one = cfg;
  one.n_layer = 1;
  ModelGraph m = build_model(one, batch, seq, ModelMode::train);
  TS_ASSIGN_OR_RETURN(BlockLayout b, search_block_layout(m.graph, *plan, cost));
  TS_ASSIGN_OR_RETURN(plan->params, expand_block_layout(b, full, *plan));
  return b;
}

}  // namespace tessera
