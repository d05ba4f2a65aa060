// Expert parallelism in the partition pass (parallel/partition_pass.h): on the expert axis, an
// activation split on one dim that an op takes split on another — the experts' buffer, split by
// token slots, meeting the expert weights split by experts, and back before the combine —
// moves there by an all_to_all (lower_step).
#include <algorithm>

#include "parallel/partition_pass.h"

namespace tessera::partition_detail {

// A move already made is reused (the buffer of both expert matmuls, and of their weights'
// gradients); among new moves, one that leaves no partial sum (an expert weight's gradient
// whole on every rank, to be reduced) is chosen.
Result<bool> Pass::move_to_experts(const Node& n, size_t k, const Placements& pk,
                                   const std::vector<Placements>& lazy,
                                   const std::vector<TensorType>& in_types,
                                   const std::function<bool(const Placements&)>& try_rule,
                                   const std::vector<Placement>& res, std::vector<ValueId>* ins,
                                   std::vector<Placements>* out_pl) {
  if (plan_.mesh.axes()[k].name != plan_.expert_axis || sizes_[k] <= 1) return false;
  struct Move {
    size_t i;
    int d;
    std::vector<Placement> res;
    std::string key;
  };
  std::vector<Move> moves;
  for (size_t i = 0; i < ins->size(); ++i) {
    if (!pk[i].is_shard() || !lazy[i].empty() || param_index_.count(n.inputs[i])) continue;
    for (int d = 0; d < in_types[i].shape.rank(); ++d) {
      if (d == pk[i].dim || in_types[i].shape[d] % sizes_[k] != 0) continue;
      Placements p = pk;
      p[i] = Placement::shard(d);
      if (!try_rule(p)) continue;  // (it fills `res`)
      Placements target = out_.placements[static_cast<size_t>((*ins)[i])];
      target[k] = Placement::shard(d);
      std::string key = std::to_string((*ins)[i]);  // axes of one rank are any placement
      for (size_t a = 0; a < target.size(); ++a)
        key += " " + (sizes_[a] > 1 ? target[a].to_string() : std::string("-"));
      moves.push_back({i, d, res, key});
    }
  }
  auto pick = [&](auto pred) { return std::find_if(moves.begin(), moves.end(), pred); };
  auto it = pick([&](const Move& m) { return expert_moved_.count(m.key) > 0; });
  if (it == moves.end())
    it = pick([](const Move& m) {
      return std::none_of(m.res.begin(), m.res.end(),
                          [](const Placement& p) { return p.is_partial(); });
    });
  if (it == moves.end() && !moves.empty()) it = moves.begin();
  if (it == moves.end()) return false;
  ValueId& in = (*ins)[it->i];
  auto done = expert_moved_.find(it->key);
  if (done != expert_moved_.end()) {
    in = done->second;
  } else {
    Placements target = out_.placements[static_cast<size_t>(in)];
    target[k] = Placement::shard(it->d);
    TS_ASSIGN_OR_RETURN(in, convert(in, in_types[it->i].shape, target, n));
    expert_moved_[it->key] = in;
  }
  for (size_t o = 0; o < it->res.size(); ++o) (*out_pl)[o][k] = it->res[o];
  return true;
}

}  // namespace tessera::partition_detail
