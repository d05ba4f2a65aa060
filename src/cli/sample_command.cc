// `tessera sample --checkpoint DIR --prompt TEXT`: generate text from a trained checkpoint.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "data/tokenizer.h"
#include "io/model_config.h"
#include "io/sharded_checkpoint.h"
#include "runtime/sampler.h"

namespace tessera {

namespace {

struct SampleArgs {
  std::string checkpoint;
  std::string prompt = "\n";
  int tokens = 100;
  double temperature = 0.8;
  int top_k = 40;
  uint64_t seed = 0;
  std::string tokenizer;
};

Status run_sample(const SampleArgs& a) {
  if (a.tokens < 0) return error("--tokens must be >= 0");
  if (!(a.temperature >= 0) || !std::isfinite(a.temperature))
    return error("--temperature must be 0 (greedy) or positive, got " +
                 std::to_string(a.temperature));
  if (a.top_k < 0)
    return error("--top-k must be 0 (all tokens) or positive, got " + std::to_string(a.top_k));
  TS_ASSIGN_OR_RETURN(ShardedCheckpoint ck, ShardedCheckpoint::open(a.checkpoint));
  nlohmann::json model_json;
  try {
    model_json = ck.manifest().at("model");
  } catch (const nlohmann::json::exception&) {
    return error("checkpoint " + ck.dir() + ": manifest.json has no model config");
  }
  TS_ASSIGN_OR_RETURN(ModelConfig cfg, model_config_from_json(model_json));
  if (task_of(cfg) == ModelTask::image_classes)
    return error("checkpoint " + ck.dir() + " holds " + cfg.name + ", an image classifier",
                 "sample generates text from language models (gpt, llama); an image model's "
                 "val_accuracy is in its run's metrics.jsonl");
  if (task_of(cfg) != ModelTask::language_model)
    return error("checkpoint " + ck.dir() + " holds " + cfg.name +
                     ", an encoder-decoder trained to fill corrupted spans",
                 "sample continues a prompt with a decoder-only language model (gpt, llama); "
                 "a T5's val_loss is in its run's metrics.jsonl");
  // The tokenizer: --tokenizer, else the one beside the checkpoint (import hf and train copy
  // it there), else GPT-2's.
  std::string tok_path = a.tokenizer;
  if (tok_path.empty()) tok_path = find_tokenizer_near(ck.dir());
  const bool gpt2 = tok_path.empty();
  TS_ASSIGN_OR_RETURN(Tokenizer tok,
                      Tokenizer::load(gpt2 ? default_data_dir() + "/gpt2" : tok_path));
  if (tok.vocab_size() > cfg.vocab_size)
    std::fprintf(stderr, "note: the tokenizer (%s) has %d tokens, the model %lld: %s\n",
                 tok.name().c_str(), tok.vocab_size(), static_cast<long long>(cfg.vocab_size),
                 gpt2 ? "no tokenizer.json is beside the checkpoint, so GPT-2's is used; pass "
                        "the model's with --tokenizer"
                      : "is it this model's tokenizer?");
  // A document's start token first, as in training (unless the model's vocabulary lacks it).
  std::vector<int32_t> prompt;
  if (tok.document_start() >= 0 && tok.document_start() < cfg.vocab_size)
    prompt.push_back(tok.document_start());
  tok.encode_append(a.prompt, &prompt);
  if (prompt.empty()) return error("--prompt is empty and the tokenizer has no start token");
  for (int32_t id : prompt)
    if (id >= cfg.vocab_size)
      return error("the prompt's token " + std::to_string(id) + " (\"" +
                       tok.decode(std::span<const int32_t>(&id, 1)) +
                       "\") is beyond the model's vocabulary of " + std::to_string(cfg.vocab_size) +
                       " tokens",
                   "pass the model's tokenizer with --tokenizer (a tokenizer.json or the model "
                   "folder holding it)");
  ModelGraph m = build_model(cfg, 1, cfg.max_seq_len, ModelMode::logits);
  CpuBackend cpu;
  Executor ex(m.graph, cpu);
  for (ValueId p : m.graph.params()) {
    const std::string& name = m.graph.name_of(p);
    // Any plan's checkpoint: the whole tensor is assembled from the shards.
    TS_ASSIGN_OR_RETURN(Shape shape, ck.global_shape(name));
    if (shape != m.graph.type(p).shape)
      return error("checkpoint " + ck.dir() + ": tensor " + name + " has shape " +
                   shape.to_string() + ", expected " + m.graph.type(p).shape.to_string());
    TS_RETURN_IF_ERROR(ck.read(name, 0, shape.numel(), ex.data<float>(p)));
  }
  std::mt19937_64 rng(a.seed);
  SampleOptions opt{a.temperature, a.top_k};
  TS_ASSIGN_OR_RETURN(std::vector<int32_t> out, sample_tokens(ex, m, prompt, a.tokens, opt, rng));
  std::printf("%s%s\n", a.prompt.c_str(), tok.decode(out, /*document_start=*/false).c_str());
  return Status();
}

}  // namespace

void add_sample_command(CLI::App& app) {
  auto a = std::make_shared<SampleArgs>();
  CLI::App* cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  cmd->add_option("--checkpoint", a->checkpoint,
                  "Checkpoint directory, or a run's checkpoints/ root")
      ->required();
  cmd->add_option("--prompt", a->prompt, "Text to continue")->capture_default_str();
  cmd->add_option("--tokens", a->tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "Softmax temperature (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "Sample among the k most likely tokens (0: all)")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--tokenizer", a->tokenizer,
                  "A tokenizer.json or the folder holding it (default: the one beside the "
                  "checkpoint, else GPT-2's)");
  cmd->callback([a] { exit_on_error(run_sample(*a)); });
}

}  // namespace tessera
