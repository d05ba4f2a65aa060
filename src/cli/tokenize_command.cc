// `tessera tokenize --input TEXT --out DIR`: GPT-2 BPE token shards train.bin and val.bin.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/common.h"
#include "data/tokenize_corpus.h"
#include "data/tokenizer.h"

namespace tessera {

namespace {

struct TokenizeArgs {
  std::string input;
  std::string out;
  double val_fraction = 0.05;
  bool force = false;
};

Status run_tokenize(const TokenizeArgs& a) {
  if (!(a.val_fraction > 0 && a.val_fraction < 1))
    return error("--val-fraction must be in (0, 1), got " + std::to_string(a.val_fraction));
  for (const char* shard : {"train.bin", "val.bin"})
    if (!a.force && std::filesystem::exists(std::filesystem::path(a.out) / shard))
      return error("--out '" + a.out + "' already holds " + shard +
                       " (token shards a run may be reading, or resume from)",
                   "choose another --out, or pass --force to replace the shards");
  TS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(default_data_dir() + "/gpt2"));
  TS_RETURN_IF_ERROR(tokenize_corpus(a.input, a.out, a.val_fraction, tok));
  std::fprintf(stderr, "wrote %s/train.bin and %s/val.bin\n", a.out.c_str(), a.out.c_str());
  return Status();
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Turn a UTF-8 text into GPT-2 token shards");
  cmd->add_option("--input", a->input, "UTF-8 text file")->required();
  cmd->add_option("--out", a->out, "Output directory for train.bin and val.bin")->required();
  cmd->add_option("--val-fraction", a->val_fraction, "Share of tokens for validation")
      ->capture_default_str();
  cmd->add_flag("--force", a->force, "Replace train.bin and val.bin when --out holds them");
  cmd->callback([a] { exit_on_error(run_tokenize(*a)); });
}

}  // namespace tessera
