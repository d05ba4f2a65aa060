// The preset of a model test, failing the test when the name is unknown.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "models/model.h"

namespace tessera {

inline ModelConfig preset(const std::string& name) {
  std::optional<ModelConfig> c = find_preset(name);
  EXPECT_TRUE(c.has_value()) << name;
  return c.value_or(ModelConfig{});
}

}  // namespace tessera
