// `tessera tokenize --input PATH... --out DIR`: token shards (train*.bin, val*.bin) and a
// manifest from text or JSONL files, folders of them or stdin, with GPT-2's tokenizer or a
// model's tokenizer.json (data/tokenize_corpus.h).
#include <sys/resource.h>

#include <cstdio>
#include <filesystem>
#include <optional>

#include "base/format.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "data/tokenize_corpus.h"
#include "data/tokenizer.h"

namespace tessera {

namespace {

struct TokenizeArgs {
  std::vector<std::string> inputs;
  std::string out;
  std::string tokenizer;
  std::string field = "text";
  std::string format = "auto";
  int64_t shard_tokens = 100'000'000;
  double val_fraction = 0.05;
  std::optional<int64_t> val_tokens;
  int threads = 0;
  bool force = false;
};

Status run_tokenize(const TokenizeArgs& a) {
  if (!(a.val_fraction > 0 && a.val_fraction < 1))
    return error("--val-fraction must be in (0, 1), got " + std::to_string(a.val_fraction));
  if (a.shard_tokens < 1)
    return error("--shard-tokens must be positive, got " + std::to_string(a.shard_tokens));
  if (a.threads < 0)
    return error("--threads must be 0 (every core) or positive, got " + std::to_string(a.threads));
  TokenizeOptions o;
  o.inputs = a.inputs;
  o.out = a.out;
  o.corpus.field = a.field;
  if (a.format == "text")
    o.corpus.format = CorpusFormat::text;
  else if (a.format == "jsonl")
    o.corpus.format = CorpusFormat::jsonl;
  else if (a.format != "auto")
    return error("--format must be auto, text or jsonl, got '" + a.format + "'");
  o.shard_tokens = a.shard_tokens;
  o.val_fraction = a.val_fraction;
  if (a.val_tokens && *a.val_tokens < 0)
    return error("--val-tokens must be 0 (no validation) or positive, got " +
                 std::to_string(*a.val_tokens));
  o.val_tokens = a.val_tokens.value_or(-1);
  o.threads = a.threads;
  std::error_code ec;
  if (!a.force && std::filesystem::is_directory(a.out, ec))
    for (const auto& e : std::filesystem::directory_iterator(a.out, ec)) {
      const std::string name = e.path().filename().string();
      if (is_tokenized_shard_name(name) || name == "manifest.json")
        return error("--out '" + a.out + "' already holds " + name +
                         " (token shards a run may be reading, or resume from)",
                     "choose another --out, or pass --force to replace the shards");
    }
  TS_ASSIGN_OR_RETURN(
      Tokenizer tok,
      Tokenizer::load(a.tokenizer.empty() ? default_data_dir() + "/gpt2" : a.tokenizer));
  TS_ASSIGN_OR_RETURN(TokenizeSummary done, tokenize_to_shards(o, tok));
  const double per_core = double(done.bytes) / done.seconds / done.threads;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);  // ru_maxrss: KiB on Linux
  std::fprintf(stderr,
               "wrote %zu train and %zu val shard(s) and manifest.json to %s: %s tokens (%s "
               "train, %s val) from %s in %lld document(s); %s tokens/s on %d thread(s), %s/s "
               "of text per thread; peak memory %s\n",
               done.train_shards.size(), done.val_shards.size(), a.out.c_str(),
               format_count(done.tokens).c_str(), format_count(done.train_tokens).c_str(),
               format_count(done.val_tokens).c_str(), format_bytes(double(done.bytes)).c_str(),
               static_cast<long long>(done.documents),
               format_si(double(done.tokens) / done.seconds).c_str(), done.threads,
               format_bytes(per_core).c_str(), format_bytes(1024.0 * usage.ru_maxrss).c_str());
  return Status();
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Turn text or JSONL (files, folders, stdin; plain or .gz) into token shards");
  cmd->add_option("--input", a->inputs,
                  "Text or JSONL files, folders of them (recursively), or - for stdin")
      ->required();
  cmd->add_option("--out", a->out, "Output directory for the shards and manifest.json")->required();
  cmd->add_option("--tokenizer", a->tokenizer,
                  "A Hugging Face tokenizer.json, or the model folder holding it (default: "
                  "GPT-2's, shipped in data/gpt2)");
  cmd->add_option("--format", a->format, "auto (by name: .jsonl/.ndjson are JSONL), text or jsonl")
      ->capture_default_str();
  cmd->add_option("--field", a->field, "The JSONL field that holds each document's text")
      ->capture_default_str();
  cmd->add_option("--shard-tokens", a->shard_tokens, "Tokens per shard")->capture_default_str();
  CLI::Option* fraction = cmd->add_option("--val-fraction", a->val_fraction,
                                          "Share of the tokens (the last ones) for validation")
                              ->capture_default_str();
  cmd->add_option("--val-tokens", a->val_tokens,
                  "Tokens (the last ones) for validation, instead of --val-fraction")
      ->excludes(fraction);
  cmd->add_option("--threads", a->threads, "Encoding threads (0: every core)")
      ->capture_default_str();
  cmd->add_flag("--force", a->force, "Replace the shards when --out holds some");
  cmd->callback([a] { exit_on_error(run_tokenize(*a)); });
}

}  // namespace tessera
