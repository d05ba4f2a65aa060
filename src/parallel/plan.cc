#include "parallel/plan.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

namespace tessera {

int Mesh::size() const {
  int n = 1;
  for (const MeshAxis& a : axes_) n *= a.size;
  return n;
}

int Mesh::axis_index(const std::string& name) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == name) return static_cast<int>(i);
  return -1;
}

int Mesh::axis_size(const std::string& name) const {
  int i = axis_index(name);
  return i < 0 ? 1 : axes_[static_cast<size_t>(i)].size;
}

std::vector<int> Mesh::coords(int rank) const {
  std::vector<int> c(axes_.size());
  for (size_t i = axes_.size(); i-- > 0;) {
    c[i] = rank % axes_[i].size;
    rank /= axes_[i].size;
  }
  return c;
}

int Mesh::rank_of(const std::vector<int>& c) const {
  int r = 0;
  for (size_t i = 0; i < axes_.size(); ++i) r = r * axes_[i].size + c[i];
  return r;
}

int Mesh::group_index(int rank, const std::vector<std::string>& names) const {
  std::vector<int> c = coords(rank);
  int idx = 0;
  for (size_t i = 0; i < axes_.size(); ++i)
    for (const std::string& n : names)
      if (n == axes_[i].name) idx = idx * axes_[i].size + c[i];
  return idx;
}

int Mesh::group_size(const std::vector<std::string>& names) const {
  int n = 1;
  for (const std::string& a : names) n *= axis_size(a);
  return n;
}

int Mesh::group_color(int rank, const std::vector<std::string>& names) const {
  std::vector<int> c = coords(rank);
  for (size_t i = 0; i < axes_.size(); ++i)
    for (const std::string& n : names)
      if (n == axes_[i].name) c[i] = 0;
  return rank_of(c);
}

std::string Mesh::to_string() const {
  std::string s = "{";
  for (size_t i = 0; i < axes_.size(); ++i)
    s += (i ? ", " : "") + axes_[i].name + ": " + std::to_string(axes_[i].size);
  return s + "}";
}

std::string axes_key(const std::vector<std::string>& axes) {
  std::string s;
  for (const std::string& a : axes) s += (s.empty() ? "" : ",") + a;
  return s;
}

std::vector<std::string> axes_of_key(const std::string& key) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find(',', start);
    if (end == std::string::npos) end = key.size();
    out.push_back(key.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

const char* recompute_name(RecomputePolicy p) {
  switch (p) {
    case RecomputePolicy::none:
      return "none";
    case RecomputePolicy::full:
      return "full";
    case RecomputePolicy::selective:
      return "selective";
  }
  return "?";
}

Result<RecomputePolicy> parse_recompute(std::string_view name) {
  for (RecomputePolicy p :
       {RecomputePolicy::none, RecomputePolicy::full, RecomputePolicy::selective})
    if (name == recompute_name(p)) return p;
  return error("recompute '" + std::string(name) + "' is not one of: none, full, selective",
               "full recomputes each transformer block's forward in the backward pass; "
               "selective recomputes only the cheap ops between its matmuls and attention");
}

const char* offload_name(OffloadPolicy p) {
  switch (p) {
    case OffloadPolicy::none:
      return "none";
    case OffloadPolicy::optimizer:
      return "optimizer";
    case OffloadPolicy::params:
      return "params";
  }
  return "?";
}

Result<OffloadPolicy> parse_offload(std::string_view name) {
  for (OffloadPolicy p : {OffloadPolicy::none, OffloadPolicy::optimizer, OffloadPolicy::params})
    if (name == offload_name(p)) return p;
  return error("offload '" + std::string(name) + "' is not one of: none, optimizer, params",
               "optimizer keeps the f32 master weights and AdamW moments in host memory and "
               "runs AdamW on the host (ZeRO-Offload); params (with --zero 3) also keeps the "
               "parameter blocks there, copied to the device for each gather");
}

const char* context_order_name(ContextOrder o) {
  return o == ContextOrder::zigzag ? "zigzag" : "contiguous";
}

Result<ContextOrder> parse_context_order(std::string_view name) {
  for (ContextOrder o : {ContextOrder::contiguous, ContextOrder::zigzag})
    if (name == context_order_name(o)) return o;
  return error("context order '" + std::string(name) + "' is not one of: contiguous, zigzag",
               "zigzag gives every context-parallel rank the same causal attention work");
}

const char* context_attention_name(ContextAttention a) {
  return a == ContextAttention::ring ? "ring" : "gather";
}

Result<ContextAttention> parse_context_attention(std::string_view name) {
  for (ContextAttention a : {ContextAttention::gather, ContextAttention::ring})
    if (name == context_attention_name(a)) return a;
  return error("context attention '" + std::string(name) + "' is not one of: gather, ring",
               "ring passes the keys and values round the ranks a chunk at a time, the "
               "transfers overlapping the attention");
}

std::vector<std::string> Plan::replica_axes() const {
  std::vector<std::string> rest;
  for (const std::string& a : data_axes)
    if (std::find(zero_axes.begin(), zero_axes.end(), a) == zero_axes.end()) rest.push_back(a);
  return rest;
}

bool Plan::hsdp() const {
  for (const std::string& a : replica_axes())
    if (a != expert_axis) return true;
  return false;
}

Plan Plan::data_parallel(int n, int zero) {
  Plan p;
  p.mesh = Mesh({{"dp", n}});
  p.zero = zero;
  return p;
}

Plan Plan::hybrid_sharded(int replicas, int shards, int tp) {
  Plan p;
  p.mesh = Mesh({{"dp_rep", replicas}, {"dp_shard", shards}});
  if (tp > 1) {
    p.mesh = Mesh({{"dp_rep", replicas}, {"dp_shard", shards}, {"tp", tp}});
    p.tensor_axes = {"tp"};
  }
  p.data_axes = {"dp_rep", "dp_shard"};
  p.zero_axes = {"dp_shard"};
  p.zero = 3;
  return p;
}

Plan Plan::tensor_parallel(int dp, int tp, int zero) {
  Plan p;
  p.mesh = Mesh({{"dp", dp}, {"tp", tp}});
  p.tensor_axes = {"tp"};
  p.zero = zero;
  return p;
}

Plan Plan::pipeline_parallel(int pp, int dp, int tp, int zero) {
  Plan p;
  p.mesh = Mesh({{"pp", pp}, {"dp", dp}, {"tp", tp}});
  p.pipeline_axis = "pp";
  p.tensor_axes = {"tp"};
  p.zero = zero;
  return p;
}

namespace {

// Checks that `p` may take a new axis of `size` ranks for `role` ("context", flag --cp, name
// cp), held in *field: refused when it has one already or places parameters (their placements
// would need one more axis). Inserts it inside the data and pipeline axes, outside the tensor
// axes (a tensor group's ranks stay consecutive). false: size 1, nothing to add.
Result<bool> insert_inner_axis(Plan* p, int size, const char* role, const char* name,
                               std::string* field) {
  const std::string flag = std::string("--") + name;
  if (size < 1) return error(flag + " must be at least 1, got " + std::to_string(size));
  if (size == 1) return false;
  if (!field->empty())
    return error("plan: it has " + std::string(role[0] == 'e' ? "an " : "a ") + role + " axis ('" +
                 *field + "') already");
  if (!p->params.empty())
    return error("plan: " + std::string(role) + " parallelism on a plan that places parameters",
                 "give the " + std::string(role) + " axis in the plan file (\"" + role +
                     "_axis\": \"" + name + "\")");
  std::vector<MeshAxis> axes = p->mesh.axes();
  auto at = axes.end();
  for (auto it = axes.begin(); it != axes.end(); ++it)
    if (std::count(p->tensor_axes.begin(), p->tensor_axes.end(), it->name)) {
      at = it;
      break;
    }
  axes.insert(at, MeshAxis{name, size});
  p->mesh = Mesh(std::move(axes));
  *field = name;
  return true;
}

}  // namespace

Status add_context_axis(Plan* p, int cp) {
  TS_ASSIGN_OR_RETURN(bool added, insert_inner_axis(p, cp, "context", "cp", &p->context_axis));
  if (!added) return Status();
  // ZeRO shards over the context ranks too (their parameters are replicas, as the data ranks'),
  // unless the plan shards within a group of the data ranks only (HSDP).
  if (p->zero_axes == p->data_axes) p->zero_axes = p->with_context_axis(p->zero_axes);
  return Status();
}

Status add_expert_axis(Plan* p, int ep) {
  TS_ASSIGN_OR_RETURN(bool added, insert_inner_axis(p, ep, "expert", "ep", &p->expert_axis));
  if (!added) return Status();
  std::vector<std::string> data;  // in mesh order
  for (const MeshAxis& a : p->mesh.axes())
    if (a.name == "ep" || std::count(p->data_axes.begin(), p->data_axes.end(), a.name))
      data.push_back(a.name);
  p->data_axes = std::move(data);
  return Status();
}

std::vector<Placement> Plan::placements_of(const std::string& name) const {
  auto it = params.find(name);
  if (it != params.end()) return it->second;
  return std::vector<Placement>(mesh.axes().size(), Placement::replicate());
}

std::vector<std::string> Plan::with_context_axis(const std::vector<std::string>& axes) const {
  std::vector<std::string> out;
  for (const MeshAxis& a : mesh.axes())
    if (a.name == context_axis || std::count(axes.begin(), axes.end(), a.name))
      out.push_back(a.name);
  return out;
}

std::vector<std::string> Plan::grad_norm_axes() const {
  std::vector<std::string> out;
  const bool zero_sharded = shards_grads() || shards_optimizer();
  for (const MeshAxis& a : mesh.axes()) {
    const bool z = zero_sharded && std::count(zero_axes.begin(), zero_axes.end(), a.name);
    const bool t = tensor_group() > 1 && std::count(tensor_axes.begin(), tensor_axes.end(), a.name);
    const bool pp = stages() > 1 && a.name == pipeline_axis;
    const bool e = expert_group() > 1 && a.name == expert_axis;  // each rank's own experts
    if (z || t || pp || e) out.push_back(a.name);
  }
  return out;
}

Result<Placement> parse_placement(std::string_view t) {
  if (t == "R") return Placement::replicate();
  if (t == "P") return Placement::partial();
  if (t.size() >= 4 && t.substr(0, 2) == "S(" && t.back() == ')') {
    std::string_view d = t.substr(2, t.size() - 3);
    int v = 0;
    bool digits = !d.empty() && d.size() < 4;
    for (char ch : d) {
      digits = digits && ch >= '0' && ch <= '9';
      v = v * 10 + (ch - '0');
    }
    if (digits) return Placement::shard(v);
  }
  return error("placement '" + std::string(t) + "' is not R, P or S(dim)",
               "S(0) splits dim 0 over the axis; R replicates");
}

std::string Plan::describe() const {
  std::string s;
  for (size_t i = 0; i < mesh.axes().size(); ++i)
    s += (i ? " x " : "") + mesh.axes()[i].name + "=" + std::to_string(mesh.axes()[i].size);
  s += " zero=" + std::to_string(zero);
  if (zero >= 1 && hsdp() && zero_group() > 1) s += " (HSDP)";
  if (micro_batches > 1) s += " micro_batches=" + std::to_string(micro_batches);
  if (recompute != RecomputePolicy::none) {
    s += std::string(" recompute=") + recompute_name(recompute);
    if (recompute_layers >= 0) s += " (first " + std::to_string(recompute_layers) + " blocks)";
  }
  if (sequence_parallel) s += " sequence-parallel";
  if (context_group() > 1)
    s += std::string(" context-parallel") +
         (context_order == ContextOrder::zigzag ? " (zigzag)" : "") +
         (context_attention == ContextAttention::ring ? " (ring)" : "");
  if (expert_group() > 1) s += " expert-parallel";
  if (offload != OffloadPolicy::none) s += std::string(" offload=") + offload_name(offload);
  if (stages() > 1) {
    s += std::string(" schedule=") + schedule_name(schedule);
    if (virtual_stages > 1) s += " virtual_stages=" + std::to_string(virtual_stages);
    if (!stage_layers.empty()) {
      s += " stage_layers=";
      for (size_t i = 0; i < stage_layers.size(); ++i)
        s += (i ? "," : "") + std::to_string(stage_layers[i]);
    }
  }
  return s;
}

Status validate(const Plan& p, int world) {
  if (p.mesh.axes().empty()) return error("plan: the mesh has no axes", "use {\"dp\": N}");
  std::set<std::string> names;
  for (const MeshAxis& a : p.mesh.axes()) {
    if (a.name.empty() || !names.insert(a.name).second)
      return error("plan: mesh axis names must be unique and non-empty, got '" + a.name + "'");
    if (a.size < 1)
      return error("plan: mesh axis '" + a.name + "' has size " + std::to_string(a.size) +
                   "; sizes must be >= 1");
  }
  for (const std::string& a : p.data_axes)
    if (!names.count(a)) return error("plan: data axis '" + a + "' is not a mesh axis");
  for (const std::string& a : p.zero_axes) {
    if (!names.count(a)) return error("plan: zero axis '" + a + "' is not a mesh axis");
    if (std::find(p.data_axes.begin(), p.data_axes.end(), a) == p.data_axes.end() &&
        a != p.context_axis)
      return error("plan: zero axis '" + a + "' must also be a data axis (or the context axis)");
  }
  auto has = [](const std::vector<std::string>& v, const std::string& a) {
    return std::find(v.begin(), v.end(), a) != v.end();
  };
  for (const std::string& a : p.tensor_axes) {
    if (!names.count(a)) return error("plan: tensor axis '" + a + "' is not a mesh axis");
    if (has(p.data_axes, a))
      return error("plan: axis '" + a + "' is both a data and a tensor axis",
                   "the batch splits over data axes, parameters over tensor axes");
  }
  if (!p.pipeline_axis.empty()) {
    if (!names.count(p.pipeline_axis))
      return error("plan: pipeline axis '" + p.pipeline_axis + "' is not a mesh axis");
    if (has(p.data_axes, p.pipeline_axis) || has(p.tensor_axes, p.pipeline_axis))
      return error("plan: axis '" + p.pipeline_axis + "' is the pipeline axis and also a " +
                   (has(p.data_axes, p.pipeline_axis) ? "data" : "tensor") + " axis");
  }
  if (!p.context_axis.empty()) {
    if (!names.count(p.context_axis))
      return error("plan: context axis '" + p.context_axis + "' is not a mesh axis");
    if (has(p.data_axes, p.context_axis) || has(p.tensor_axes, p.context_axis) ||
        p.context_axis == p.pipeline_axis)
      return error("plan: axis '" + p.context_axis + "' is the context axis and also a " +
                   (has(p.data_axes, p.context_axis)     ? "data"
                    : has(p.tensor_axes, p.context_axis) ? "tensor"
                                                         : "pipeline") +
                   " axis");
  }
  if (!p.expert_axis.empty()) {
    if (!names.count(p.expert_axis))
      return error("plan: expert axis '" + p.expert_axis + "' is not a mesh axis");
    if (!has(p.data_axes, p.expert_axis))
      return error("plan: expert axis '" + p.expert_axis + "' must also be a data axis",
                   "list it in data_axes: the batch splits over the expert-parallel ranks");
    if (has(p.zero_axes, p.expert_axis) && p.mesh.axis_size(p.expert_axis) > 1)
      return error("plan: ZeRO over the expert axis '" + p.expert_axis + "' is not supported",
                   "leave it out of zero_axes (ZeRO shards over the other data axes)");
  }
  for (const MeshAxis& a : p.mesh.axes())
    if (!has(p.data_axes, a.name) && !has(p.tensor_axes, a.name) && a.name != p.pipeline_axis &&
        a.name != p.context_axis)
      return error("plan: mesh axis '" + a.name +
                       "' is neither a data, a tensor, the pipeline nor the context axis",
                   "list it in data_axes or tensor_axes, or name it pipeline_axis or "
                   "context_axis");
  for (const auto& [name, pl] : p.params) {
    if (pl.size() != p.mesh.axes().size())
      return error("plan: parameter '" + name + "' has " + std::to_string(pl.size()) +
                   " placements for a mesh of " + std::to_string(p.mesh.axes().size()) + " axes");
    for (size_t i = 0; i < pl.size(); ++i) {
      const std::string& axis = p.mesh.axes()[i].name;
      if (pl[i].is_partial())
        return error("plan: parameter '" + name + "' is Partial on '" + axis +
                     "'; a parameter is Replicate or Shard(dim)");
      if (pl[i].is_shard() && !has(p.tensor_axes, axis) && axis != p.expert_axis)
        return error("plan: parameter '" + name + "' is sharded on data axis '" + axis + "'",
                     "data axes shard parameters through the ZeRO stage; shard on a tensor axis");
    }
  }
  if (p.zero < 0 || p.zero > 3)
    return error("plan: zero stage " + std::to_string(p.zero) + " is not 0, 1, 2 or 3");
  if (p.micro_batches < 1) return error("plan: micro_batches must be >= 1");
  if (p.bucket_bytes < 1 || p.prefetch_bytes < 0 || p.piece_bytes < 0)
    return error("plan: bucket_bytes must be >= 1, prefetch_bytes and piece_bytes >= 0");
  if (static_cast<int>(p.recompute) > static_cast<int>(RecomputePolicy::selective))
    return error("plan: recompute policy " + std::to_string(static_cast<int>(p.recompute)) +
                 " is not none, full or selective");
  if (p.recompute_layers < -1)
    return error("plan: recompute_layers = " + std::to_string(p.recompute_layers) +
                 " is not a number of blocks (-1: every block)");
  if (p.recompute_layers >= 0 && p.recompute == RecomputePolicy::none)
    return error(
        "plan: recompute_layers = " + std::to_string(p.recompute_layers) + " but recompute is none",
        "set recompute to full or selective for those blocks");
  if (static_cast<int>(p.offload) > static_cast<int>(OffloadPolicy::params))
    return error("plan: offload policy " + std::to_string(static_cast<int>(p.offload)) +
                 " is not none, optimizer or params");
  if (p.offloads_params() && p.zero < 3)
    return error("plan: offloading the parameters needs ZeRO-3 (zero = " + std::to_string(p.zero) +
                     "): the device gathers them from host memory",
                 "add --zero 3, or use --offload optimizer");
  if (p.offloads_optimizer() && p.stages() > 1)
    return error(std::string("plan: offloading the ") +
                     (p.offloads_params() ? "parameters" : "optimizer") +
                     " is not supported with pipeline stages yet",
                 "use --offload none with --pp, or data and tensor parallelism with offload");
  if (p.sequence_parallel && p.tensor_group() < 2)
    return error("plan: sequence parallelism needs a tensor axis of 2 or more ranks",
                 "add --tp N (the sequence is split over the tensor-parallel ranks)");
  if (p.virtual_stages < 1)
    return error("plan: virtual_stages = " + std::to_string(p.virtual_stages) + " must be >= 1");
  if (p.virtual_stages > 1 && p.schedule != ScheduleKind::interleaved)
    return error("plan: virtual_stages = " + std::to_string(p.virtual_stages) + " needs the " +
                     "interleaved schedule, not " + schedule_name(p.schedule),
                 "use --schedule interleaved, or one virtual stage");
  if (p.stages() > 1 && p.virtual_stages == 1 && p.schedule == ScheduleKind::interleaved)
    return error("plan: the interleaved schedule with one virtual stage per stage is plain 1F1B",
                 "add --virtual-stages 2 (or more model chunks per stage), or use --schedule "
                 "1f1b");
  if (!p.stage_layers.empty() && static_cast<int>(p.stage_layers.size()) != p.chunks())
    return error("plan: stage_layers lists " + std::to_string(p.stage_layers.size()) +
                     " chunks but the pipeline has " + std::to_string(p.chunks()) +
                     " (stages x virtual stages)",
                 "give one block count per chunk");
  if (p.stages() > 1 && p.zero >= 2)
    return error("plan: ZeRO-" + std::to_string(p.zero) +
                     " with pipeline parallelism is refused: every micro-batch's backward would "
                     "reduce-scatter its gradients" +
                     (p.zero == 3 ? " and gather the stage's parameters again" : "") +
                     ", where a pipeline reduces once per step",
                 "use --zero 1 (optimizer state sharded), as Megatron and DeepSpeed do with "
                 "pipelines");
  if (world > 0 && p.mesh.size() != world)
    return error("plan: mesh " + p.mesh.to_string() + " has " + std::to_string(p.mesh.size()) +
                     " ranks but the job has " + std::to_string(world),
                 "run `tessera launch -n " + std::to_string(p.mesh.size()) +
                     " -- train ...` (or mpirun -np " + std::to_string(p.mesh.size()) +
                     "), or change the mesh");
  return Status();
}

nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json mesh = nlohmann::json::array();
  for (const MeshAxis& a : p.mesh.axes()) mesh.push_back({{"name", a.name}, {"size", a.size}});
  nlohmann::json params = nlohmann::json::object();
  for (const auto& [name, pl] : p.params) {
    nlohmann::json by_axis = nlohmann::json::object();
    for (size_t i = 0; i < pl.size() && i < p.mesh.axes().size(); ++i)
      if (!pl[i].is_replicate()) by_axis[p.mesh.axes()[i].name] = pl[i].to_string();
    params[name] = by_axis;
  }
  return {{"mesh", mesh},
          {"data_axes", p.data_axes},
          {"zero_axes", p.zero_axes},
          {"tensor_axes", p.tensor_axes},
          {"params", params},
          {"zero", p.zero},
          {"micro_batches", p.micro_batches},
          {"bucket_bytes", p.bucket_bytes},
          {"prefetch_bytes", p.prefetch_bytes},
          {"piece_bytes", p.piece_bytes},
          {"recompute", recompute_name(p.recompute)},
          {"recompute_layers", p.recompute_layers},
          {"offload", offload_name(p.offload)},
          {"fuse", p.fuse},
          {"sequence_parallel", p.sequence_parallel},
          {"pipeline_axis", p.pipeline_axis},
          {"context_axis", p.context_axis},
          {"context_order", context_order_name(p.context_order)},
          {"context_attention", context_attention_name(p.context_attention)},
          {"expert_axis", p.expert_axis},
          {"schedule", schedule_name(p.schedule)},
          {"virtual_stages", p.virtual_stages},
          {"stage_layers", p.stage_layers}};
}

namespace {

// A plan key's value outside what it takes (a fraction, a number out of range): its message.
struct OutOfRange {
  std::string expect;
};

// A JSON integer in [lo, hi] (2.5, 1e18 or an out-of-range count is refused, not truncated).
template <class T>
T integer_in(const nlohmann::json& v, int64_t lo, int64_t hi) {
  const std::string range =
      "an integer from " + std::to_string(lo) +
      (hi == std::numeric_limits<int64_t>::max() ? std::string(" up")
                                                 : " to " + std::to_string(hi));
  if (!v.is_number()) return static_cast<T>(v.get<int64_t>());  // a type error: thrown
  if (!v.is_number_integer()) throw OutOfRange{range};
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    throw OutOfRange{range};
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) throw OutOfRange{range};
  return static_cast<T>(x);
}

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

}  // namespace

Result<Plan> plan_from_json(const nlohmann::json& j) {
  static const std::set<std::string> known = {"mesh",
                                              "data_axes",
                                              "zero_axes",
                                              "tensor_axes",
                                              "params",
                                              "zero",
                                              "micro_batches",
                                              "bucket_bytes",
                                              "prefetch_bytes",
                                              "piece_bytes",
                                              "recompute",
                                              "recompute_layers",
                                              "sequence_parallel",
                                              "pipeline_axis",
                                              "schedule",
                                              "virtual_stages",
                                              "stage_layers",
                                              "offload",
                                              "context_axis",
                                              "context_order",
                                              "expert_axis",
                                              "fuse",
                                              "context_attention"};
  if (!j.is_object()) return error("plan: expected a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key()))
      return error("plan: unknown key '" + it.key() + "'",
                   "keys: mesh, data_axes, zero_axes, tensor_axes, params, zero, micro_batches, "
                   "bucket_bytes, prefetch_bytes, piece_bytes, recompute, recompute_layers, "
                   "offload, fuse, "
                   "sequence_parallel, pipeline_axis, context_axis, context_order, "
                   "context_attention, expert_axis, "
                   "schedule, "
                   "virtual_stages, "
                   "stage_layers");
  if (!j.contains("mesh"))
    return error("plan: key 'mesh' is missing",
                 "a plan names its mesh, e.g. \"mesh\": [{\"name\": \"dp\", \"size\": 2}]; "
                 "`tessera plan MODEL` prints a plan to start from");
  Plan p;
  // The key being read and the type it takes, for a JSON type error.
  const char* key = "mesh";
  const char* expect = "a list of {\"name\": ..., \"size\": ...}";
  auto reading = [&](const char* k, const char* e) {
    key = k;
    expect = e;
    return j.contains(k);
  };
  try {
    if (reading("mesh", "a list of {\"name\": ..., \"size\": ...}")) {
      std::vector<MeshAxis> axes;
      for (const auto& a : j.at("mesh"))
        axes.push_back(
            {a.at("name").get<std::string>(), integer_in<int>(a.at("size"), 1, kIntMax)});
      p.mesh = Mesh(std::move(axes));
      p.data_axes.clear();
      // Default roles by name only for the names Tessera gives axes; any other axis must be
      // listed in data_axes or tensor_axes (validate() says so), never a data axis by default.
      for (const MeshAxis& a : p.mesh.axes()) {
        if (a.name == "tp") p.tensor_axes.push_back(a.name);
        if (a.name == "pp") p.pipeline_axis = a.name;
        if (a.name == "cp") p.context_axis = a.name;
        if (a.name == "ep") p.expert_axis = a.name;
        if (a.name == "dp" || a.name == "dp_rep" || a.name == "dp_shard" || a.name == "ep")
          p.data_axes.push_back(a.name);
      }
      p.zero_axes.clear();
      for (const std::string& a : p.data_axes)
        if (a != p.expert_axis) p.zero_axes.push_back(a);
    }
    if (reading("data_axes", "a list of axis names"))
      p.data_axes = j.at("data_axes").get<std::vector<std::string>>();
    if (reading("zero_axes", "a list of axis names"))
      p.zero_axes = j.at("zero_axes").get<std::vector<std::string>>();
    if (reading("tensor_axes", "a list of axis names"))
      p.tensor_axes = j.at("tensor_axes").get<std::vector<std::string>>();
    if (reading("params", "an object of parameter name -> {axis: placement}")) {
      if (!j.at("params").is_object())
        return error(
            "plan: key 'params' must be an object of parameter name -> "
            "{axis: placement}");
      for (auto it = j.at("params").begin(); it != j.at("params").end(); ++it) {
        std::vector<Placement> pl(p.mesh.axes().size(), Placement::replicate());
        if (!it.value().is_object())
          return error("plan: params['" + it.key() + "'] must be an object {axis: placement}",
                       "for example {\"tp\": \"S(0)\"}");
        for (auto ax = it.value().begin(); ax != it.value().end(); ++ax) {
          int i = p.mesh.axis_index(ax.key());
          if (i < 0)
            return error("plan: params['" + it.key() + "'] names axis '" + ax.key() +
                         "', which is not in the mesh " + p.mesh.to_string());
          if (!ax.value().is_string())
            return error("plan: params['" + it.key() + "']['" + ax.key() +
                         "'] must be a string such as \"S(0)\"");
          Result<Placement> r = parse_placement(ax.value().get<std::string>());
          if (!r.ok())
            return error(
                "plan: params['" + it.key() + "']['" + ax.key() + "']: " + r.status().message(),
                r.status().hint());
          pl[static_cast<size_t>(i)] = r.value();
        }
        p.params[it.key()] = std::move(pl);
      }
    }
    if (reading("zero", "an integer 0-3"))  // its range is validate()'s, which says why
      p.zero = integer_in<int>(j.at("zero"), -kIntMax, kIntMax);
    if (reading("micro_batches", "an integer"))
      p.micro_batches = integer_in<int>(j.at("micro_batches"), 1, kIntMax);
    if (reading("bucket_bytes", "an integer"))
      p.bucket_bytes = integer_in<int64_t>(j.at("bucket_bytes"), 0, kInt64Max);
    if (reading("prefetch_bytes", "an integer"))
      p.prefetch_bytes = integer_in<int64_t>(j.at("prefetch_bytes"), 0, kInt64Max);
    if (reading("piece_bytes", "an integer"))
      p.piece_bytes = integer_in<int64_t>(j.at("piece_bytes"), 0, kInt64Max);
    if (reading("sequence_parallel", "true or false"))
      p.sequence_parallel = j.at("sequence_parallel").get<bool>();
    if (reading("fuse", "true or false")) p.fuse = j.at("fuse").get<bool>();
    if (reading("recompute", "\"none\", \"full\" or \"selective\"")) {
      Result<RecomputePolicy> r = parse_recompute(j.at("recompute").get<std::string>());
      if (!r.ok())
        return error("plan: key 'recompute': " + r.status().message(), r.status().hint());
      p.recompute = r.value();
    }
    if (reading("offload", "\"none\", \"optimizer\" or \"params\"")) {
      Result<OffloadPolicy> o = parse_offload(j.at("offload").get<std::string>());
      if (!o.ok()) return error("plan: key 'offload': " + o.status().message(), o.status().hint());
      p.offload = o.value();
    }
    if (reading("recompute_layers", "an integer (-1: every block)"))
      p.recompute_layers = integer_in<int>(j.at("recompute_layers"), -1, kIntMax);
    if (reading("pipeline_axis", "an axis name (\"\" for none)"))
      p.pipeline_axis = j.at("pipeline_axis").get<std::string>();
    if (reading("context_axis", "an axis name (\"\" for none)"))
      p.context_axis = j.at("context_axis").get<std::string>();
    if (reading("expert_axis", "an axis name (\"\" for none)"))
      p.expert_axis = j.at("expert_axis").get<std::string>();
    if (reading("context_order", "\"contiguous\" or \"zigzag\"")) {
      Result<ContextOrder> o = parse_context_order(j.at("context_order").get<std::string>());
      if (!o.ok())
        return error("plan: key 'context_order': " + o.status().message(), o.status().hint());
      p.context_order = o.value();
    }
    if (reading("context_attention", "\"gather\" or \"ring\"")) {
      Result<ContextAttention> a =
          parse_context_attention(j.at("context_attention").get<std::string>());
      if (!a.ok())
        return error("plan: key 'context_attention': " + a.status().message(), a.status().hint());
      p.context_attention = a.value();
    }
    if (reading("schedule", "\"gpipe\", \"1f1b\", \"interleaved\" or \"zb-h1\"")) {
      Result<ScheduleKind> r = parse_schedule(j.at("schedule").get<std::string>());
      if (!r.ok()) return error("plan: key 'schedule': " + r.status().message(), r.status().hint());
      p.schedule = r.value();
    }
    if (reading("virtual_stages", "an integer"))
      p.virtual_stages = integer_in<int>(j.at("virtual_stages"), 0, kIntMax);
    if (reading("stage_layers", "a list of block counts, one per chunk"))
      for (const auto& n : j.at("stage_layers"))
        p.stage_layers.push_back(integer_in<int>(n, 0, kIntMax));
  } catch (const OutOfRange& e) {
    return error(
        std::string("plan: key '") + key + "' takes " + e.expect + ", got " + j.at(key).dump(),
        "`tessera plan MODEL` prints a plan to start from");
  } catch (const nlohmann::json::exception&) {
    return error(
        std::string("plan: key '") + key + "' must be " + expect + ", got " + j.at(key).dump(),
        "`tessera plan MODEL` prints a plan to start from");
  }
  TS_RETURN_IF_ERROR(validate(p));
  return p;
}

Result<Plan> load_plan(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return error("plan: cannot read '" + path + "': Is a directory",
                 "the path names a directory; pass a plan file (`tessera plan MODEL` prints one)");
  std::ifstream f(path);
  if (!f) return error("plan: cannot open '" + path + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  } catch (const std::exception& e) {  // a read error of the stream itself
    return error("plan: cannot read '" + path + "': " + e.what());
  }
  if (j.is_discarded()) return error("plan: '" + path + "' is not valid JSON");
  Result<Plan> p = plan_from_json(j);
  if (!p.ok()) return p.status().with_context(path);
  return p;
}

}  // namespace tessera
