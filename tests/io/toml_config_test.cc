#include "io/toml_config.h"

#include <gtest/gtest.h>

#include "io/fs.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing::TempDir;

const char* kConfig = R"(# a training config
name = "gpt2-small"
seed = 1234

[model]
n_layer = 12
n_head = "12"
d_model = 768.0
act = "gleu"
tied = true

[model.attn]
dropout = 0.1
window = [128, 256]

[optim]
lr = 1
betas = [0.9, 0.95]
)";

TomlTable parse(const std::string& text, const std::string& name = "cfg.toml") {
  Result<TomlTable> r = parse_toml_string(text, name);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : TomlTable();
}

TEST(TomlConfig, TypedGettersAndDefaults) {
  TomlTable cfg = parse(kConfig);
  EXPECT_EQ(cfg.source(), "cfg.toml");
  Result<std::string> name = cfg.get_string("name", "x");
  ASSERT_TRUE(name.ok());
  EXPECT_EQ(name.value(), "gpt2-small");
  Result<int64_t> seed = cfg.require_int("seed");
  ASSERT_TRUE(seed.ok());
  EXPECT_EQ(seed.value(), 1234);
  Result<int64_t> steps = cfg.get_int("steps", 5000);  // absent -> default
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(steps.value(), 5000);
  Result<bool> tied = cfg.get_bool("model.tied", false);  // dotted key
  ASSERT_TRUE(tied.ok());
  EXPECT_TRUE(tied.value());
  Result<double> lr = cfg.get_float("optim.lr", 0.0);  // integer accepted as float
  ASSERT_TRUE(lr.ok());
  EXPECT_EQ(lr.value(), 1.0);
  Result<double> dropout = cfg.require_float("model.attn.dropout");
  ASSERT_TRUE(dropout.ok());
  EXPECT_DOUBLE_EQ(dropout.value(), 0.1);
  Result<std::vector<int64_t>> window = cfg.get_int_array("model.attn.window", {});
  ASSERT_TRUE(window.ok());
  EXPECT_EQ(window.value(), (std::vector<int64_t>{128, 256}));
  Result<std::vector<std::string>> tags = cfg.get_string_array("tags", {"a"});
  ASSERT_TRUE(tags.ok());
  EXPECT_EQ(tags.value(), std::vector<std::string>{"a"});
  EXPECT_TRUE(cfg.has("model.attn.window"));
  EXPECT_FALSE(cfg.has("model.attn.nope"));
  EXPECT_FALSE(cfg.has("name.sub"));  // 'name' is not a table
}

TEST(TomlConfig, TypeErrorsNameFileLineKeyAndValue) {
  TomlTable cfg = parse(kConfig);
  Result<TomlTable> model = cfg.table("model");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->prefix(), "model");

  Result<int64_t> n_head = model->require_int("n_head");
  ASSERT_FALSE(n_head.ok());
  EXPECT_EQ(n_head.status().message(),
            "cfg.toml:7: key 'model.n_head' must be an integer, got string \"12\"");
  EXPECT_EQ(n_head.status().hint(), "remove the quotes: n_head = 12");

  Result<int64_t> d_model = model->get_int("d_model", 1);  // present: never defaulted
  ASSERT_FALSE(d_model.ok());
  EXPECT_EQ(d_model.status().message(),
            "cfg.toml:8: key 'model.d_model' must be an integer, got float 768");
  EXPECT_NE(d_model.status().hint().find("without a decimal point"), std::string::npos);

  Result<std::string> n_layer = model->get_string("n_layer", "");
  ASSERT_FALSE(n_layer.ok());
  EXPECT_EQ(n_layer.status().message(),
            "cfg.toml:6: key 'model.n_layer' must be a string, got integer 12");

  Result<bool> seed = cfg.get_bool("seed", false);
  ASSERT_FALSE(seed.ok());
  EXPECT_NE(seed.status().message().find("must be a boolean"), std::string::npos);

  Result<std::vector<int64_t>> betas = cfg.get_int_array("optim.betas", {});
  ASSERT_FALSE(betas.ok());
  EXPECT_EQ(betas.status().message(),
            "cfg.toml:18: key 'optim.betas' element 0 must be an integer, got float 0.9");

  Result<std::vector<int64_t>> not_array = cfg.get_int_array("seed", {});
  ASSERT_FALSE(not_array.ok());
  EXPECT_NE(not_array.status().message().find("must be an array, got integer 1234"),
            std::string::npos);

  Result<double> missing = model->require_float("lr");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "cfg.toml: missing required key 'model.lr'");

  Status custom = model->error_at("n_layer", "must be at least 24 for this preset", "raise it");
  EXPECT_EQ(custom.message(),
            "cfg.toml:6: key 'model.n_layer' must be at least 24 for this preset");
}

TEST(TomlConfig, ChoiceListsAcceptedValues) {
  TomlTable cfg = parse(kConfig);
  Result<std::string> act = cfg.get_choice("model.act", {"gelu", "relu", "swiglu"}, "gelu");
  ASSERT_FALSE(act.ok());
  EXPECT_EQ(act.status().message(),
            "cfg.toml:9: key 'model.act' must be one of gelu, relu, swiglu, got \"gleu\" (did "
            "you mean \"gelu\"?)");
  EXPECT_EQ(act.status().hint(), "accepted values: gelu, relu, swiglu");
  Result<std::string> def = cfg.get_choice("model.norm", {"layernorm", "rmsnorm"}, "rmsnorm");
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def.value(), "rmsnorm");
  Result<std::string> ok = cfg.get_choice("name", {"gpt2-small", "gpt2-medium"}, "");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.value(), "gpt2-small");
}

TEST(TomlConfig, UnknownKeysWithSuggestion) {
  TomlTable cfg = parse(kConfig);
  Result<TomlTable> model = cfg.table("model");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->keys(),
            (std::vector<std::string>{"n_layer", "n_head", "d_model", "act", "tied", "attn"}));
  EXPECT_TRUE(
      model->check_no_unknown_keys({"n_layer", "n_head", "d_model", "act", "tied", "attn"}).ok());
  Status s = model->check_no_unknown_keys({"n_layer", "n_heads", "d_model", "act", "attn"});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "cfg.toml:7: unknown key 'n_head' in [model] (did you mean 'n_heads'?); also "
            "unknown: tied");
  EXPECT_EQ(s.hint(), "accepted keys in [model]: act, attn, d_model, n_heads, n_layer");
  Status top = cfg.check_no_unknown_keys({"model", "optim", "seed"});
  ASSERT_FALSE(top.ok());
  EXPECT_EQ(top.message(), "cfg.toml:2: unknown key 'name' at the top level");
}

TEST(TomlConfig, SubTables) {
  TomlTable cfg = parse(kConfig);
  Result<TomlTable> attn = cfg.table("model.attn");
  ASSERT_TRUE(attn.ok());
  EXPECT_EQ(attn->prefix(), "model.attn");
  Result<std::vector<int64_t>> w = attn->get_int_array("window", {});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->size(), 2u);
  Result<TomlTable> attn2 = cfg.table("model");
  ASSERT_TRUE(attn2.ok());
  attn2 = attn2->table("attn");
  ASSERT_TRUE(attn2.ok());
  Result<std::string> bad = attn2->get_string("dropout", "");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("key 'model.attn.dropout'"), std::string::npos);

  // Absent table: empty, defaults apply, errors still name the file and full key.
  Result<TomlTable> data = cfg.table("data");
  ASSERT_TRUE(data.ok());
  EXPECT_TRUE(data->keys().empty());
  Result<int64_t> bs = data->get_int("batch_size", 8);
  ASSERT_TRUE(bs.ok());
  EXPECT_EQ(bs.value(), 8);
  Result<int64_t> req = data->require_int("batch_size");
  ASSERT_FALSE(req.ok());
  EXPECT_EQ(req.status().message(), "cfg.toml: missing required key 'data.batch_size'");
  Result<TomlTable> req_table = cfg.require_table("data");
  ASSERT_FALSE(req_table.ok());
  EXPECT_EQ(req_table.status().message(), "cfg.toml: missing required table [data]");

  // A scalar where a table is expected.
  Result<TomlTable> not_table = cfg.table("seed");
  ASSERT_FALSE(not_table.ok());
  EXPECT_EQ(not_table.status().message(),
            "cfg.toml:3: key 'seed' must be a table, got integer 1234");
  Result<int64_t> through_scalar = cfg.get_int("seed.x", 0);
  ASSERT_FALSE(through_scalar.ok());
  EXPECT_NE(through_scalar.status().message().find("key 'seed' must be a table"),
            std::string::npos);
}

TEST(TomlConfig, SyntaxErrorsGiveLineAndColumn) {
  Result<TomlTable> r = parse_toml_string("a = 1\nb = 2\nc = = 3\n", "bad.toml");
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_EQ(m.rfind("bad.toml:3:", 0), 0u) << m;
  EXPECT_NE(m.find("TOML syntax error: "), std::string::npos) << m;
  EXPECT_NE(r.status().hint().find("line 3"), std::string::npos);

  r = parse_toml_string("[model]\nn = 1\n[model]\nn = 2\n", "dup.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("dup.toml:3:", 0), 0u) << r.status().message();

  r = parse_toml_string("s = \"unterminated\n", "str.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("str.toml:1:", 0), 0u) << r.status().message();
}

TEST(TomlConfig, ParseFile) {
  TempDir dir;
  ASSERT_TRUE(write_file_atomic(dir / "c.toml", std::string("[model]\nn_head = \"12\"\n")).ok());
  Result<TomlTable> cfg = parse_toml_file(dir / "c.toml");
  ASSERT_TRUE(cfg.ok());
  Result<int64_t> n = cfg->get_int("model.n_head", 0);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().message(),
            dir / "c.toml" + ":2: key 'model.n_head' must be an integer, got string \"12\"");

  ASSERT_TRUE(write_file_atomic(dir / "bad.toml", std::string("x = [1, 2\n")).ok());
  Result<TomlTable> bad = parse_toml_file(dir / "bad.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind(dir / "bad.toml:", 0), 0u) << bad.status().message();

  Result<TomlTable> missing = parse_toml_file(dir / "none.toml");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("none.toml"), std::string::npos);
}

TEST(TomlConfig, Suggestions) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
  EXPECT_EQ(edit_distance("", "abc"), 3);
  EXPECT_EQ(edit_distance("same", "same"), 0);
  EXPECT_EQ(edit_distance("gleu", "gelu"), 1);  // a transposition is one edit
  EXPECT_EQ(closest_match("n_heads", {"n_head", "n_layer"}), "n_head");
  EXPECT_EQ(closest_match("lr", {"n_head", "n_layer"}), "");  // too far to be a typo
  EXPECT_EQ(join_strings({"a", "b", "c"}), "a, b, c");
  EXPECT_EQ(join_strings({}), "");
}

}  // namespace
}  // namespace tessera
