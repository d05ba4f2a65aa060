// Model configs from presets or TOML files, and back to JSON for checkpoint manifests.
//
//   TS_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config("gpt2-small"));
//   TS_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config("configs/my_model.toml"));
//
// A TOML config has a [model] table; `preset = "NAME"` starts from a preset and the other keys
// override it:
//   [model]
//   preset = "gpt2-small"
//   n_layer = 6
// Errors name the file, the key and the accepted values; an unknown preset lists the presets.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "models/model.h"

namespace tessera {

// `spec` is a preset name or a path ending in .toml.
Result<ModelConfig> load_model_config(const std::string& spec);
Result<ModelConfig> parse_model_config(const std::string& toml_text, const std::string& name);

nlohmann::json model_config_to_json(const ModelConfig& cfg);
Result<ModelConfig> model_config_from_json(const nlohmann::json& j);

}  // namespace tessera
