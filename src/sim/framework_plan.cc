#include "sim/framework_plan.h"

#include <map>
#include <nlohmann/json.hpp>
#include <vector>

namespace tessera {
namespace {

enum class Knob {
  tp,
  pp,
  dp,
  cp,
  ep,
  fsdp_shard,
  replicas,
  sharding,
  recompute,
  precision,
  offload,
  offload_params,
  sequence_parallel,
  micro_batches
};

// What each key means; `under` restricts a generic key to one parent ("stage" under
// "zero_optimization").
struct KeyMeaning {
  Knob knob;
  const char* under = nullptr;
};

const std::map<std::string, KeyMeaning>& meanings() {
  static const std::map<std::string, KeyMeaning> m = {
      {"tp", {Knob::tp}},
      {"tensor_parallel", {Knob::tp}},
      {"tensor_model_parallel_size", {Knob::tp}},
      {"tensor_parallel_degree", {Knob::tp}},
      {"tensor_parallel_size", {Knob::tp}},
      {"ici_tensor_parallelism", {Knob::tp}},
      {"pp", {Knob::pp}},
      {"pipeline_model_parallel_size", {Knob::pp}},
      {"pipeline_parallel_degree", {Knob::pp}},
      {"pipeline_parallel_size", {Knob::pp}},
      {"ici_pipeline_parallelism", {Knob::pp}},
      {"dp", {Knob::dp}},
      {"data_parallel_size", {Knob::dp}},
      {"data_parallel_degree", {Knob::dp}},
      {"data_parallel_shard_degree", {Knob::fsdp_shard}},
      {"ici_fsdp_parallelism", {Knob::fsdp_shard}},
      {"data_parallel_replicate_degree", {Knob::replicas}},
      {"ici_data_parallelism", {Knob::replicas}},
      {"cp", {Knob::cp}},
      {"context_parallel_size", {Knob::cp}},
      {"context_parallel_degree", {Knob::cp}},
      {"ici_context_parallelism", {Knob::cp}},
      {"ep", {Knob::ep}},
      {"expert_model_parallel_size", {Knob::ep}},
      {"expert_parallel_degree", {Knob::ep}},
      {"ici_expert_parallelism", {Knob::ep}},
      {"sharding", {Knob::sharding}},
      {"sharding_strategy", {Knob::sharding}},
      {"zero", {Knob::sharding}},
      {"zero_stage", {Knob::sharding}},
      {"stage", {Knob::sharding, "zero_optimization"}},
      {"fsdp", {Knob::sharding}},
      {"use_distributed_optimizer", {Knob::sharding}},
      {"recompute", {Knob::recompute}},
      {"recompute_granularity", {Knob::recompute}},
      {"activation_checkpointing", {Knob::recompute}},
      {"mode", {Knob::recompute, "activation_checkpoint"}},
      {"gradient_checkpointing", {Knob::recompute}},
      {"precision", {Knob::precision}},
      {"mixed_precision", {Knob::precision}},
      {"mixed_precision_param", {Knob::precision}},
      {"dtype", {Knob::precision}},
      {"bf16", {Knob::precision}},
      {"fp16", {Knob::precision}},
      {"float8", {Knob::precision}},
      {"offload", {Knob::offload}},
      {"device", {Knob::offload, "offload_optimizer"}},
      {"offload_param.device", {Knob::offload_params}},  // (looked up as parent.key first)
      {"sequence_parallel", {Knob::sequence_parallel}},
      {"micro_batches", {Knob::micro_batches}},
      {"gradient_accumulation_steps", {Knob::micro_batches}},
      {"num_microbatches", {Knob::micro_batches}},
  };
  return m;
}

// One setting: its key as written (a path for nested ones), the key's name, its parent's name
// ("" at the top) and the value.
struct Setting {
  std::string path, key, parent;
  const nlohmann::json* value;
};

// The leaves of `j`; {"enabled": v} under a key stands for that key with v (DeepSpeed's
// "bf16": {"enabled": true}).
void leaves(const nlohmann::json& j, const std::string& path, const std::string& parent,
            std::vector<Setting>* out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string p = path.empty() ? it.key() : path + "." + it.key();
    if (it.value().is_object()) {
      leaves(it.value(), p, normalized_term(it.key()), out);
    } else if (normalized_term(it.key()) == "enabled" && !parent.empty()) {
      out->push_back({p, parent, "", &it.value()});
    } else {
      out->push_back({p, normalized_term(it.key()), parent, &it.value()});
    }
  }
}

Result<int> degree(const Setting& s, bool rest_allowed) {
  const nlohmann::json& v = *s.value;
  if (!v.is_number_integer())
    return error("plan: '" + s.path + "' must be a whole number, got " + v.dump());
  const int64_t n = v.get<int64_t>();
  if (n == -1 && rest_allowed) return 0;
  if (n < 1 || n > (1 << 24))
    return error("plan: '" + s.path + "' must be between 1 and 16,777,216" +
                 std::string(rest_allowed ? " (or -1: the ranks left)" : "") + ", got " + v.dump());
  return static_cast<int>(n);
}

// A term's text: a string, or for the keys that take them a boolean or a ZeRO stage number.
Result<std::string> term_text(const Setting& s, Knob knob) {
  const nlohmann::json& v = *s.value;
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) {
    const bool on = v.get<bool>();
    if (knob == Knob::sharding) {
      if (s.key == "use_distributed_optimizer") return std::string(on ? "ZeRO-1" : "none");
      if (s.key == "fsdp") return std::string(on ? "FSDP" : "none");
    }
    if (knob == Knob::recompute) return std::string(on ? "full" : "none");
    if (knob == Knob::precision) {
      if (s.key == "bf16") return std::string(on ? "bf16" : "");
      if (s.key == "fp16") return std::string(on ? "fp16" : "");
      if (s.key == "float8") return std::string(on ? "fp8" : "");
    }
  }
  if (knob == Knob::sharding && v.is_number_integer()) {
    const int64_t stage = v.get<int64_t>();
    if (stage >= 0 && stage <= 3) return "ZeRO-" + std::to_string(stage);
  }
  return error("plan: '" + s.path + "' is " + v.dump() + ", not a spelling of " +
               (knob == Knob::sharding    ? "a sharding (ZeRO-0..3, FULL_SHARD, ...)"
                : knob == Knob::recompute ? "a recomputation (full, selective, none)"
                                          : "a precision (bf16, fp16, fp32, fp8)"));
}

}  // namespace

bool is_framework_plan(const nlohmann::json& j) { return j.is_object() && !j.contains("mesh"); }

Result<FrameworkPlan> read_framework_plan(const nlohmann::json& j) {
  if (!j.is_object()) return error("plan: expected a JSON object");
  std::vector<Setting> settings;
  leaves(j, "", "", &settings);
  FrameworkPlan p;
  int shard = -2, replicas = -2;  // torchtitan / MaxText data degrees; -2: not given
  // Which key set each knob, to what: two keys of one knob must agree.
  std::map<Knob, std::pair<std::string, std::string>> set_by;
  auto claim = [&](Knob k, const Setting& s, const std::string& value) -> Status {
    auto [it, fresh] = set_by.emplace(k, std::pair{s.path, value});
    if (fresh || it->second.second == value) return Status();
    return error("plan: '" + it->second.first + "' says " + it->second.second + " but '" + s.path +
                     "' says " + value,
                 "keep one of them");
  };
  for (const Setting& s : settings) {
    auto it = meanings().find(s.parent + "." + s.key);
    if (it == meanings().end()) it = meanings().find(s.key);
    if (it == meanings().end() || (it->second.under && s.parent != it->second.under))
      return error("plan: unknown key '" + s.path + "'",
                   "a plan in a framework's words takes the parallel degrees (tp, pp, dp, cp, ep "
                   "and their Megatron, DeepSpeed, torchtitan and MaxText names), sharding, "
                   "recompute, precision, offload, sequence_parallel and micro_batches; cut a "
                   "framework's section down to them (docs/reference.md lists every key)");
    const Knob knob = it->second.knob;
    int* degree_of = knob == Knob::tp              ? &p.tp
                     : knob == Knob::pp            ? &p.pp
                     : knob == Knob::cp            ? &p.cp
                     : knob == Knob::ep            ? &p.ep
                     : knob == Knob::dp            ? &p.dp
                     : knob == Knob::fsdp_shard    ? &shard
                     : knob == Knob::replicas      ? &replicas
                     : knob == Knob::micro_batches ? &p.micro_batches
                                                   : nullptr;
    if (degree_of) {
      const bool rest = knob == Knob::dp || knob == Knob::fsdp_shard || knob == Knob::replicas;
      TS_ASSIGN_OR_RETURN(*degree_of, degree(s, rest));
      if (knob == Knob::ep) p.ep_beside_dp = s.key.rfind("ici_", 0) == 0;
      TS_RETURN_IF_ERROR(claim(knob, s, s.value->dump()));
      continue;
    }
    switch (knob) {
      case Knob::sharding: {
        TS_ASSIGN_OR_RETURN(std::string text, term_text(s, knob));
        Result<ShardingTerm> t = parse_sharding_term(text);
        if (!t.ok()) return t.status().with_context("plan: '" + s.path + "'");
        p.sharding = *t;
        p.sharding_given = true;
        TS_RETURN_IF_ERROR(claim(
            knob, s,
            (t->hsdp ? "HSDP, ZeRO-" : "ZeRO-") + std::to_string(t->zero) +
                (t->shard > 0 ? " in groups of " + std::to_string(t->shard) : std::string())));
        break;
      }
      case Knob::recompute: {
        TS_ASSIGN_OR_RETURN(std::string text, term_text(s, knob));
        Result<RecomputeTerm> t = parse_recompute_term(text);
        if (!t.ok()) return t.status().with_context("plan: '" + s.path + "'");
        p.recompute = recompute_name(t->policy);
        TS_RETURN_IF_ERROR(claim(knob, s, p.recompute));
        break;
      }
      case Knob::precision: {
        TS_ASSIGN_OR_RETURN(std::string text, term_text(s, knob));
        if (text.empty()) break;  // "bf16": false says nothing of the precision
        Result<PrecisionTerm> t = parse_precision_term(text);
        if (!t.ok()) return t.status().with_context("plan: '" + s.path + "'");
        // FP8 GEMMs go with bf16 elsewhere: "float8" beside a bf16 key is one precision.
        const std::string name = t->fp8 ? "fp8" : dtype_name(t->dtype);
        const std::string as = name == "fp8" ? "bf16" : name;
        TS_RETURN_IF_ERROR(claim(knob, s, as));
        if (p.precision.empty() || name == "fp8") p.precision = name;
        break;
      }
      case Knob::offload: {
        if (!s.value->is_string())
          return error("plan: '" + s.path + "' must be a string, got " + s.value->dump());
        const std::string v = normalized_term(s.value->get<std::string>());
        const bool on = v == "optimizer" || v == "cpu";
        if (!on && v != "none")
          return error("plan: '" + s.path + "' is '" + s.value->get<std::string>() +
                           "'; the optimizer offloads to host memory only",
                       s.key == "device" ? "\"device\": \"cpu\" (or \"none\")"
                                         : "\"optimizer\" or \"none\" (the parameters offload "
                                           "with DeepSpeed's offload_param: {\"device\": "
                                           "\"cpu\"} beside offload_optimizer's)");
        TS_RETURN_IF_ERROR(claim(knob, s, on ? "optimizer" : "none"));
        p.offload_optimizer = on;
        break;
      }
      case Knob::offload_params: {  // DeepSpeed's offload_param.device (ZeRO-Infinity)
        const std::string v =
            s.value->is_string() ? normalized_term(s.value->get<std::string>()) : "";
        if (v != "cpu" && v != "none")
          return error("plan: '" + s.path + "' is " + s.value->dump() +
                           "; parameters offload to host memory only",
                       "\"device\": \"cpu\" (or \"none\")");
        TS_RETURN_IF_ERROR(claim(knob, s, v));
        p.offload_params = v == "cpu";
        break;
      }
      case Knob::sequence_parallel:
        if (!s.value->is_boolean())
          return error("plan: '" + s.path + "' must be true or false, got " + s.value->dump());
        p.sequence_parallel = s.value->get<bool>();
        TS_RETURN_IF_ERROR(claim(knob, s, s.value->dump()));
        break;
      default:
        break;
    }
  }
  // torchtitan's and MaxText's data degrees: FSDP (ZeRO-3) over the shard degree S, replicated
  // R times (HSDP when both exceed 1); 0 stands for "the ranks left" (-1 as written).
  if (shard != -2 || replicas != -2) {
    const int S = shard == -2 ? (replicas == 0 ? 1 : 0) : shard;  // not given: the rest
    const int R = replicas == -2 ? 1 : replicas;
    if (S == 0 && R == 0)
      return error("plan: the shard and the replicate degree are both -1 (the ranks left)",
                   "give one of them as a number");
    if (S != 1 && p.sharding_given && p.sharding.zero != 3)
      return error("plan: a shard degree with a sharding of ZeRO-" +
                   std::to_string(p.sharding.zero) + ": the shard degree shards with ZeRO-3");
    const int dp = S > 0 && R > 0 ? S * R : 0;
    if (set_by.count(Knob::dp) && p.dp != 0 && p.dp != dp)
      return error("plan: '" + set_by[Knob::dp].first + "' says " + std::to_string(p.dp) +
                       " data-parallel ranks, the shard and replicate degrees " +
                       (dp > 0 ? std::to_string(dp) : std::string("the ranks left")),
                   "keep one of them");
    p.dp = dp;
    if (S != 1) {
      p.sharding = ShardingTerm{3, R != 1, R != 1 ? S : 0};
      p.sharding_given = true;
      p.replicas = R != 1 ? R : 0;  // 0 with hsdp: dp / shard
    } else if (p.sharding_given && p.sharding.zero == 3 && !p.sharding.hsdp) {
      return error("plan: a shard degree of 1 with a sharding of ZeRO-3 (FSDP)",
                   "a shard degree of 1 shards nothing: drop one of them");
    }
  }
  return p;
}

}  // namespace tessera
