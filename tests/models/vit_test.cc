// ViT: parameter counts of the public ImageNet-1k checkpoints, the graph's inputs and shapes,
// config validation.
#include <gtest/gtest.h>

#include "models/model.h"

namespace tessera {
namespace {

ModelConfig preset(const std::string& name) {
  std::optional<ModelConfig> c = find_preset(name);
  EXPECT_TRUE(c.has_value()) << name;
  return c.value_or(ModelConfig{});
}

// timm's vit_base_patch16_224 (86,567,656) and vit_large_patch16_224 (304,326,632), and
// vit_huge_patch14_224 with its 1000-class head (632.05 M); HF's ViTForImageClassification
// has the same tensors.
TEST(Vit, ExactParameterCountsOfThePublicModels) {
  EXPECT_EQ(build_model(preset("vit-b16"), 1, 0, ModelMode::logits).graph.param_count(), 86567656);
  EXPECT_EQ(build_model(preset("vit-l16"), 1, 0, ModelMode::logits).graph.param_count(), 304326632);
  EXPECT_EQ(count_params(preset("vit-h14")), 632045800);
}

TEST(Vit, TakesImagesAndLabelsAndGivesClassLogits) {
  ModelConfig c = preset("vit-tiny");
  EXPECT_EQ(task_of(c), ModelTask::image_classes);
  EXPECT_EQ(task_of(preset("gpt-tiny")), ModelTask::language_model);
  ModelGraph m = build_model(c, 3, 0, ModelMode::train);
  ASSERT_EQ(m.inputs.size(), 2u);
  EXPECT_EQ(m.inputs[0].name, kImagesInput);
  EXPECT_EQ(m.graph.type(m.inputs[0].value).shape, (Shape{3, 1, 28, 28}));
  EXPECT_FALSE(m.inputs[0].target);
  EXPECT_EQ(m.inputs[1].name, kLabelsInput);
  EXPECT_EQ(m.graph.type(m.inputs[1].value).shape, (Shape{3}));
  EXPECT_TRUE(m.inputs[1].target);
  EXPECT_EQ(m.graph.type(m.logits).shape, (Shape{3, 10}));
  EXPECT_EQ(m.seq, 17);  // the class token and 4 x 4 patches
  EXPECT_EQ(m.graph.param_grads().size(), m.graph.params().size());
}

TEST(Vit, ValidateNamesTheImageKeys) {
  ModelConfig c = preset("vit-tiny");
  ASSERT_TRUE(validate(c).ok());
  ModelConfig patch = c;
  patch.patch_size = 5;  // 28 % 5 != 0
  Status s = validate(patch);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("patch_size"), std::string::npos) << s.message();
  ModelConfig seq = c;
  seq.max_seq_len = 64;
  s = validate(seq);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("17"), std::string::npos) << s.message();
  ModelConfig gpt = preset("gpt-tiny");
  gpt.image_size = 28;
  s = validate(gpt);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("image_size"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tessera
