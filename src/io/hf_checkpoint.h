// Hugging Face model folders in and out of Tessera checkpoints (`tessera import hf`,
// `tessera export hf`), for GPT-2 (GPT2LMHeadModel) and LLaMA (LlamaForCausalLM).
//
//   // config.json + model.safetensors (or model.safetensors.index.json and its shards)
//   TS_ASSIGN_OR_RETURN(HfImport in, import_hf("llama-hf/", "runs/llama/checkpoints"));
//   // -> runs/llama/checkpoints/step-00000000 (parameters only) and `latest`
//   TS_ASSIGN_OR_RETURN(HfExport out, export_hf("runs/llama/checkpoints", "llama-out/",
//                                                {DType::bf16}));
//
// Import reads one tensor at a time and converts BF16 / F16 to F32 exactly; the checkpoint
// it writes holds the parameters (one file per HF shard) and a manifest with the model
// config and no optimizer state: `tessera sample` runs on it and `tessera train --init-from`
// starts from it. Export reads any Tessera checkpoint (any plan, sharded or not) and writes
// config.json and model.safetensors, or shards of at most max_shard_bytes with an index, as
// save_pretrained does. Names and layouts: models/hf_format.h.
//
// Failure behaviour: every error names the folder or file and the key or tensor: a missing
// or unsupported config key, a tensor of the wrong shape or dtype, a tensor that is no
// parameter of the model (e.g. biases in a LLaMA), a missing parameter, a truncated file.
// Nothing is left under the output on failure: import stages the checkpoint like every
// checkpoint (checkpoint.h); export writes into a temporary folder beside --out and renames
// it into place, refusing an --out that exists and is not an empty directory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "ir/dtype.h"
#include "models/model.h"

namespace tessera {

struct HfImport {
  ModelConfig cfg;
  std::string checkpoint_dir;                // the step directory written
  int64_t tensors = 0, params = 0;           // parameters read
  std::vector<std::string> unknown_keys;     // config.json keys neither mapped nor harmless
  int64_t skipped_tensors = 0;               // buffers that hold no parameter
  std::map<std::string, int64_t> converted;  // "BF16" -> tensors converted to F32
};

Result<HfImport> import_hf(const std::string& hf_dir, const std::string& checkpoint_root);

struct HfExportOptions {
  DType dtype = DType::f32;                 // f32, bf16 or f16
  int64_t max_shard_bytes = 5'000'000'000;  // save_pretrained's default "5GB"
};

struct HfExport {
  ModelConfig cfg;
  std::vector<std::string> files;  // written into the output folder
  int64_t tensors = 0, bytes = 0;  // tensor data written
};

Result<HfExport> export_hf(const std::string& checkpoint, const std::string& hf_dir,
                           const HfExportOptions& options = {});

}  // namespace tessera
