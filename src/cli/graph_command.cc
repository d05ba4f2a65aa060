// `tessera graph MODEL`: op count, parameter count, FLOPs per token and planned memory.
#include <chrono>
#include <cstdio>

#include "base/format.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "io/model_config.h"
#include "parallel/memory_plan.h"

namespace tessera {

namespace {

struct GraphOptions {
  std::string model;
  int64_t batch = 1;
  int64_t seq = 0;
  bool print = false;
};

Status run_graph(const GraphOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  TS_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(o.model));
  if (o.seq < 0)
    return error("--seq must be positive (or 0: max_seq_len), got " + std::to_string(o.seq));
  int64_t seq = o.seq > 0 ? o.seq : cfg.max_seq_len;
  if (seq > cfg.max_seq_len)
    return error("--seq " + std::to_string(seq) + " exceeds the model's max_seq_len " +
                 std::to_string(cfg.max_seq_len));
  if (o.batch <= 0) return error("--batch must be positive");
  ModelGraph m = build_model(cfg, o.batch, seq, ModelMode::train);
  const Graph& g = m.graph;
  MemoryPlan plan = plan_memory(g);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t fwd_nodes = 0;
  for (const Node& n : g.nodes()) fwd_nodes += n.backward ? 0 : 1;
  double tokens = static_cast<double>(o.batch * seq);
  if (o.print) std::fputs(print_graph(g).c_str(), stdout);
  std::printf("model            %s (%s)\n", cfg.name.c_str(), cfg.family.c_str());
  std::printf(
      "shape            %lld layers, width %lld, %lld heads (%lld kv), ffn %lld, vocab %lld\n",
      (long long)cfg.n_layer, (long long)cfg.n_embd, (long long)cfg.n_head,
      (long long)cfg.kv_heads(), (long long)cfg.ffn(), (long long)cfg.vocab_size);
  if (cfg.is_moe())
    std::printf(
        "experts          %lld per block, %lld per token, capacity %lld slots each (factor "
        "%.3g)\n",
        (long long)cfg.n_experts, (long long)cfg.experts_per_token,
        (long long)cfg.expert_capacity(o.batch, seq), cfg.capacity_factor);
  std::printf("ops              %zu (forward %lld, backward %lld)\n", g.nodes().size(),
              (long long)fwd_nodes,
              (long long)(static_cast<int64_t>(g.nodes().size()) - fwd_nodes));
  std::printf("parameters       %s (%s in f32)\n", format_count(g.param_count()).c_str(),
              format_bytes(static_cast<double>(plan.param_bytes)).c_str());
  std::printf("FLOPs per token  %s forward, %s training step (batch %lld, seq %lld)\n",
              format_si(g.forward_flops() / tokens).c_str(),
              format_si(g.total_flops() / tokens).c_str(), (long long)o.batch, (long long)seq);
  std::printf("activations      %s planned arena (live peak %s)\n",
              format_bytes(static_cast<double>(plan.arena_bytes)).c_str(),
              format_bytes(static_cast<double>(plan.live_peak_bytes)).c_str());
  std::printf("built in         %.3f s\n", secs);
  return Status();
}

}  // namespace

void add_graph_command(CLI::App& app) {
  auto o = std::make_shared<GraphOptions>();
  CLI::App* cmd = app.add_subcommand("graph", "Build a model's training graph and report its size");
  cmd->add_option("model", o->model, "Preset name or config.toml")->required();
  cmd->add_option("--batch", o->batch, "Batch size for the memory plan")->capture_default_str();
  cmd->add_option("--seq", o->seq, "Sequence length (default, or 0: the model's max_seq_len)");
  cmd->add_flag("--print", o->print, "Print every node of the graph");
  cmd->callback([o] { exit_on_error(run_graph(*o)); });
}

}  // namespace tessera
