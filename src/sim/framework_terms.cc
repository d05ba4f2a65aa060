#include "sim/framework_terms.h"

#include <algorithm>
#include <regex>

namespace tessera {

std::string normalized_term(const std::string& text) {
  std::string out;
  for (char c : text) {
    char d = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (d == '-' || d == ' ' || d == '_') {
      if (!out.empty() && out.back() != '_') out += '_';
      continue;
    }
    out += d;
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

bool framework_blocks_pipeline_sends(const std::string& framework) {
  // DeepSpeed driving the pipeline ("DeepSpeed + Megatron-LM", Megatron-DeepSpeed, NeoX), not
  // Megatron-LM's schedules with DeepSpeed's ZeRO beside them ("Megatron-LM + DeepSpeed").
  const std::string f = normalized_term(framework);
  return f.rfind("deepspeed", 0) == 0 || f.find("megatron_deepspeed") != std::string::npos ||
         f.find("neox") != std::string::npos;
}

std::vector<int> framework_pipeline_cut(const std::string& framework, int blocks, int chunks) {
  if (chunks < 1 || blocks < chunks) return {};
  const std::string f = normalized_term(framework);
  const bool megatron =
      f.find("megatron") != std::string::npos || f.find("nemo") != std::string::npos;
  if (!framework_blocks_pipeline_sends(framework) && !megatron) return {};
  std::vector<int> even(static_cast<size_t>(chunks), blocks / chunks);
  for (int i = 0; i < blocks % chunks; ++i) ++even[static_cast<size_t>(i)];
  if (!framework_blocks_pipeline_sends(framework)) return even;
  const int most = (blocks + chunks - 1) / chunks;
  std::vector<int> greedy;
  for (int left = blocks; left > 0; left -= most) greedy.push_back(std::min(most, left));
  return static_cast<int>(greedy.size()) == chunks ? greedy : even;
}

bool framework_interleaves_pipelines(const std::string& framework) {
  const std::string f = normalized_term(framework);
  return !framework_blocks_pipeline_sends(framework) &&
         (f.find("megatron") != std::string::npos || f.find("nemo") != std::string::npos);
}

bool framework_fuses_epilogues(const std::string& framework) {
  const std::string f = normalized_term(framework);
  return f.empty() || f.find("megatron") != std::string::npos ||
         f.find("nemo") != std::string::npos || f.find("neox") != std::string::npos ||
         f.find("llm.c") != std::string::npos;
}

bool framework_materializes_attention(const std::string& framework, int year) {
  const std::string f = normalized_term(framework);
  if (f.empty() || year <= 0 || year > 2022) return false;
  for (const char* fused : {"flash", "sdpa", "cudnn", "transformer_engine", "llm_foundry",
                            "composer", "llm.c", "nemo", "megatron_core"})
    if (f.find(fused) != std::string::npos) return false;
  return true;
}

bool framework_fuses_grad_accumulation(const std::string& framework, int year) {
  const std::string f = normalized_term(framework);
  if (year < 2022 || f.find("deepspeed") != std::string::npos) return false;
  return f.find("megatron") != std::string::npos || f.find("nemo") != std::string::npos;
}

bool framework_sums_f16_gradients_in_f16(const std::string& framework) {
  const std::string f = normalized_term(framework);
  if (f.find("megatron_core") != std::string::npos || f.find("nemo") != std::string::npos)
    return false;
  return f.find("megatron") != std::string::npos || f.find("deepspeed") != std::string::npos ||
         f.find("neox") != std::string::npos;
}

namespace {

bool has(const std::string& s, const char* word) { return s.find(word) != std::string::npos; }

bool matches(const std::string& s, const char* pattern) {
  return std::regex_search(s, std::regex(pattern));
}

}  // namespace

Result<ShardingTerm> parse_sharding_term(const std::string& text) {
  const std::string s = normalized_term(text);
  ShardingTerm t;
  if (matches(s, R"(zero_?r(?![a-z0-9]))"))
    return error("ZeRO-R (partitioned activations with model parallelism, in '" + text +
                 "') is not modeled");
  const bool zero2 = has(s, "shard_grad_op") || matches(s, R"(zero_?(stage_?)?2(?![a-z0-9]))") ||
                     matches(s, R"(stage_?2(?![a-z0-9]))") ||
                     (has(s, "p_os+g") && !has(s, "p_os+g+p"));
  // A shard degree, named as one: "dp_shard=8", "shard degree 8", "data_parallel_shard_degree
  // 8", "shard=8" (not a bare "shard 64", which may be a GPU count).
  std::smatch m;
  const std::regex degree(R"((?:dp_shard|shard_degree|shard_?=)_?[=:]?_?(\d+))");
  const bool with_degree = std::regex_search(s, m, degree);
  if (has(s, "hybrid_shard") || matches(s, R"((^|[^a-z])hsdp)") || with_degree) {
    t.hsdp = true;
    t.zero = zero2 ? 2 : 3;
    if (with_degree) {
      const long long n = std::strtoll(m[1].str().c_str(), nullptr, 10);
      if (n < 1 || n > (1 << 24))
        return error("sharding '" + text + "' names a shard degree of " + m[1].str() +
                     ", outside 1 to 16,777,216");
      t.shard = static_cast<int>(n);
    }
    return t;
  }
  if (has(s, "no_shard")) return t;  // FSDP's NO_SHARD: plain data parallelism
  if (zero2) {
    t.zero = 2;
    return t;
  }
  if (matches(s, R"(zero_?(stage_?)?3(?![a-z0-9]))") || matches(s, R"(stage_?3(?![a-z0-9]))") ||
      has(s, "p_os+g+p") || has(s, "full_shard") || has(s, "fully_shard") || has(s, "fsdp")) {
    t.zero = 3;
    return t;
  }
  if (matches(s, R"(zero_?(stage_?)?1(?![a-z0-9]))") || matches(s, R"(stage_?1(?![a-z0-9]))") ||
      has(s, "p_os") || has(s, "distributed_optimizer") || has(s, "distributedoptimizer") ||
      has(s, "sharded_optimizer") || has(s, "zeroredundancyoptimizer") ||
      has(s, "optimizer_state_sharding")) {
    t.zero = 1;
    return t;
  }
  // Last, so that "DDP + ZeRO-1" is ZeRO-1.
  if (matches(s, R"(^(none|ddp|no|off)(?![a-z0-9]))") || matches(s, R"(zero_?0(?![a-z0-9]))") ||
      matches(s, R"(stage_?0(?![a-z0-9]))"))
    return t;
  return error("sharding '" + text + "' is not a spelling Tessera knows",
               "known: none/NO_SHARD/DDP, ZeRO-1/distributed optimizer, ZeRO-2/SHARD_GRAD_OP, "
               "ZeRO-3/FULL_SHARD/FSDP/FSDP2, HYBRID_SHARD/HSDP (with a shard degree)");
}

Result<PrecisionTerm> parse_precision_term(const std::string& text) {
  const std::string s = normalized_term(text);
  PrecisionTerm p;
  if (has(s, "fp8") || has(s, "float8") || has(s, "e4m3") || has(s, "delayed_scaling") ||
      has(s, "tensorwise") || has(s, "rowwise")) {
    p.dtype = DType::bf16;
    p.fp8 = true;
    return p;
  }
  if (has(s, "bf16") || has(s, "bfloat16")) {
    p.dtype = DType::bf16;
    return p;
  }
  if (has(s, "fp16") || has(s, "float16") || has(s, "half") || has(s, "16_bit") || has(s, "apex") ||
      matches(s, R"((^|_)amp($|_))")) {
    p.dtype = DType::f16;
    return p;
  }
  if (has(s, "fp32") || has(s, "float32") || has(s, "tf32") || matches(s, R"(^single)")) {
    p.dtype = DType::f32;
    return p;
  }
  return error("precision '" + text + "' is not a spelling Tessera knows" +
                   (has(s, "mixed") ? " (mixed precision in which format?)" : ""),
               "known: fp8/float8 (tensorwise, rowwise, delayed scaling, Transformer Engine), "
               "bf16/bfloat16/amp_bf16, fp16/half/amp/apex, fp32/tf32");
}

Result<RecomputeTerm> parse_recompute_term(const std::string& text) {
  const std::string s = normalized_term(text);
  RecomputeTerm r;
  if (matches(s, R"(every_(n|\d+|2nd|other|few)_?)") || has(s, "some_blocks") ||
      has(s, "some_layers") || has(s, "partial"))
    return error("recomputation of some blocks only ('" + text + "') is not modeled");
  if (has(s, "selective") || has(s, "core_attention")) {
    r.policy = RecomputePolicy::selective;
    return r;
  }
  if (matches(s, R"(^(none|no|off|disabled|false|0)(?![a-z0-9]))") ||
      matches(s, R"((^|_)r_0(?![a-z0-9]))")) {
    r.policy = RecomputePolicy::none;
    return r;
  }
  if (has(s, "full") || has(s, "activation_checkpointing") || has(s, "gradient_checkpointing") ||
      has(s, "checkpoint_activations") || has(s, "every_block") || has(s, "every_layer") ||
      has(s, "all_layers") || matches(s, R"(^(yes|true|on|1)$)")) {
    r.policy = RecomputePolicy::full;
    return r;
  }
  return error("activation recomputation '" + text + "' is not a spelling Tessera knows",
               "known: full/activation checkpointing, selective, none/off");
}

}  // namespace tessera
