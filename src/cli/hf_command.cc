// `tessera import hf DIR --out CKPT` and `tessera export hf CKPT --out DIR`: Hugging Face
// model folders (GPT-2, LLaMA, T5) in and out of Tessera checkpoints (io/hf_checkpoint.h).
#include <cstdio>
#include <filesystem>

#include "base/format.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "data/tokenizer.h"
#include "io/hf_checkpoint.h"

namespace tessera {

namespace {

struct HfArgs {
  std::string format, from, out;
  std::string dtype = "f32";
  int64_t max_shard_bytes = 5'000'000'000;
};

Status check_format(const std::string& format) {
  if (format == "hf") return Status();
  return error("unknown checkpoint format \"" + format + "\"",
               "the format Tessera converts is \"hf\" (a Hugging Face model folder)");
}

Status run_import(const HfArgs& a) {
  TS_RETURN_IF_ERROR(check_format(a.format));
  TS_ASSIGN_OR_RETURN(HfImport in, import_hf(a.from, a.out));
  std::printf("imported %s (%s, %lld layers): %s parameters in %lld tensors -> %s\n",
              a.from.c_str(), in.cfg.family.c_str(), static_cast<long long>(in.cfg.n_layer),
              format_count(in.params).c_str(), static_cast<long long>(in.tensors),
              in.checkpoint_dir.c_str());
  for (const auto& [dtype, n] : in.converted)
    std::printf("note: %lld %s tensors converted to F32 (exactly)\n", static_cast<long long>(n),
                dtype.c_str());
  if (in.skipped_tensors > 0)
    std::printf(
        "note: %lld buffers that hold no parameter skipped (attention masks, rotary "
        "frequencies, a tied LM head, T5's embedding copies)\n",
        static_cast<long long>(in.skipped_tensors));
  if (!in.unknown_keys.empty()) {
    std::string keys;
    for (const std::string& k : in.unknown_keys) keys += (keys.empty() ? "" : ", ") + k;
    std::printf("note: config.json keys Tessera does not know, ignored: %s\n", keys.c_str());
  }
  // The model folder's tokenizer goes beside the checkpoint, where sample finds it.
  const std::string tok_json = (std::filesystem::path(a.from) / "tokenizer.json").string();
  if (std::filesystem::exists(tok_json)) {
    Result<Tokenizer> tok = Tokenizer::load(tok_json);
    if (tok.ok()) {
      TS_RETURN_IF_ERROR(tok->copy_to(a.out));
      std::printf("tokenizer: %d tokens, copied to %s (sample and export use it)\n",
                  tok->vocab_size(), a.out.c_str());
    } else {
      std::printf(
          "note: the folder's tokenizer.json is not one Tessera reads (%s); sample "
          "needs --tokenizer\n",
          tok.status().message().c_str());
    }
  }
  if (task_of(in.cfg) == ModelTask::language_model)  // sample continues prompts
    std::printf("sample: tessera sample --checkpoint %s\n", a.out.c_str());
  return Status();
}

Status run_export(const HfArgs& a) {
  TS_RETURN_IF_ERROR(check_format(a.format));
  HfExportOptions opt;
  std::optional<DType> dtype = parse_dtype(a.dtype);
  if (!dtype || *dtype == DType::i32)
    return error("--dtype must be f32 (fp32), bf16 or f16 (fp16), got \"" + a.dtype + "\"");
  opt.dtype = *dtype;
  opt.max_shard_bytes = a.max_shard_bytes;
  TS_ASSIGN_OR_RETURN(HfExport out, export_hf(a.from, a.out, opt));
  // The tokenizer beside the checkpoint (import hf or train put it there) goes with it.
  // Copied as it is (the model is written already: a tokenizer Tessera does not read must
  // not fail the export).
  if (const std::string tok_json = find_tokenizer_near(a.from); !tok_json.empty()) {
    const std::filesystem::path from = std::filesystem::path(tok_json).parent_path();
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      std::error_code ec;
      if (!std::filesystem::exists(from / f)) continue;
      std::filesystem::copy_file(from / f, std::filesystem::path(a.out) / f,
                                 std::filesystem::copy_options::overwrite_existing, ec);
      if (ec)
        std::printf("note: %s was not copied into %s: %s\n", (from / f).c_str(), a.out.c_str(),
                    ec.message().c_str());
    }
    std::printf("tokenizer: copied %s to %s\n", tok_json.c_str(), a.out.c_str());
  }
  std::printf("exported %s (%s) to %s: %lld tensors, %s in %zu files\n", a.from.c_str(),
              out.cfg.family.c_str(), a.out.c_str(), static_cast<long long>(out.tensors),
              format_bytes(out.bytes).c_str(), out.files.size());
  return Status();
}

}  // namespace

void add_hf_commands(CLI::App& app) {
  auto a = std::make_shared<HfArgs>();
  CLI::App* in = app.add_subcommand(
      "import", "Convert a Hugging Face model folder (GPT-2, LLaMA, T5) into a Tessera checkpoint");
  in->add_option("format", a->format, "Source format: hf")->required();
  in->add_option("dir", a->from, "Folder with config.json and model.safetensors (or shards)")
      ->required();
  in->add_option("--out", a->out, "Checkpoint root to write (step-00000000 and latest)")
      ->required();
  in->callback([a] { exit_on_error(run_import(*a)); });

  CLI::App* ex = app.add_subcommand(
      "export", "Write a Tessera checkpoint as a Hugging Face model folder (GPT-2, LLaMA, T5)");
  ex->add_option("format", a->format, "Target format: hf")->required();
  ex->add_option("checkpoint", a->from, "Checkpoint directory, or a run's checkpoints/ root")
      ->required();
  ex->add_option("--out", a->out, "Folder to write (new, or an empty directory)")->required();
  ex->add_option("--dtype", a->dtype, "Stored dtype: f32, bf16 or f16")->capture_default_str();
  ex->add_option("--max-shard-bytes", a->max_shard_bytes,
                 "Largest safetensors file before the weights are split into shards with an "
                 "index")
      ->capture_default_str();
  ex->callback([a] { exit_on_error(run_export(*a)); });
}

}  // namespace tessera
