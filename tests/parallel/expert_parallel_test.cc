// Expert parallelism (Plan::expert_axis): the partition of a mixture-of-experts step whose
// experts are split over an "ep" axis, and the plan's axis.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "models/model.h"
#include "parallel/program.h"

namespace tessera {
namespace {

// Each rank holds half of every block's experts; the experts' buffers cross the axis by
// all-to-all twice in the forward pass (to the experts, back to the tokens) and twice in the
// backward pass, and nothing in the experts' scope is gathered.
TEST(ExpertParallel, ExpertsSplitAndTokensMoveByAllToAll) {
  const ModelConfig c = *find_preset("moe-tiny");
  ModelGraph m = build_model(c, 4, 32, ModelMode::train);
  Plan plan = Plan::data_parallel(1);
  ASSERT_TRUE(add_expert_axis(&plan, 2).ok());
  EXPECT_EQ(plan.describe(), "dp=1 x ep=2 zero=0 expert-parallel");
  Result<Program> p = lower(m.graph, plan);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  std::map<std::string, int> experts;  // "<op> <axes>" of the collectives in experts' scopes
  for (const Node& n : p->part.local.nodes())
    if (is_collective(n.op) && n.scope.find(".moe.experts") != std::string::npos)
      ++experts[std::string(op_name(n.op)) + " " + n.attr<GroupAttrs>().axes];
  EXPECT_EQ(experts["all_to_all ep"], 4 * static_cast<int>(c.n_layer));
  EXPECT_EQ(experts.size(), 1u);
  for (const ParamLayout& pl : p->part.params) {
    const bool expert = pl.name.find(".moe.experts.") != std::string::npos;
    EXPECT_EQ(pl.local_shape[0], expert ? pl.global_shape[0] / 2 : pl.global_shape[0]) << pl.name;
  }
  // The token slots each rank routes are its own share of the capacity.
  for (const Node& n : p->part.local.nodes()) {
    if (n.op == OpKind::moe_slots) {
      EXPECT_EQ(n.attr<MoeAttrs>().capacity, c.expert_capacity(4, 32) / 2);
    }
  }
}

// An all-to-all packs each rank's block in front and unpacks what arrives. With ep 2 of 8
// experts a block holds 4 experts' slots and one transpose per exchange remains (the other
// side's order is already the wire's); with ep 8 each block is one expert and neither side
// moves an element: reshapes only.
TEST(ExpertParallel, AllToAllTransposesOnlyWhatItMustMove) {
  const ModelConfig c = *find_preset("moe-tiny");
  ASSERT_EQ(c.n_experts, 8);
  ModelGraph m = build_model(c, 8, 32, ModelMode::train);
  for (int ep : {2, 8}) {
    Plan plan = Plan::data_parallel(1);
    ASSERT_TRUE(add_expert_axis(&plan, ep).ok());
    Result<Program> p = lower(m.graph, plan);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    int exchanges = 0, transposes = 0;
    for (const Node& n : p->part.local.nodes()) {
      if (n.scope.find(".moe.experts") == std::string::npos) continue;
      exchanges += n.op == OpKind::all_to_all;
      transposes += n.op == OpKind::transpose;
    }
    EXPECT_EQ(exchanges, 4 * static_cast<int>(c.n_layer)) << "ep " << ep;
    EXPECT_EQ(transposes, ep == 8 ? 0 : exchanges) << "ep " << ep;
  }
}

TEST(ExpertParallel, PlansNameTheAxisAndKeepZeroOffIt) {
  Plan plan = Plan::tensor_parallel(2, 2, /*zero=*/1);
  ASSERT_TRUE(add_expert_axis(&plan, 2).ok());
  EXPECT_EQ(plan.mesh.to_string(), "{dp: 2, ep: 2, tp: 2}");  // tp innermost
  EXPECT_EQ(plan.data_axes, (std::vector<std::string>{"dp", "ep"}));
  EXPECT_EQ(plan.zero_axes, (std::vector<std::string>{"dp"}));
  Result<Plan> back = plan_from_json(plan_to_json(plan));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->expert_axis, "ep");
  EXPECT_EQ(back->expert_group(), 2);
  EXPECT_EQ(back->zero_axes, plan.zero_axes);
  EXPECT_NE(add_expert_axis(&plan, 2).message().find("already"), std::string::npos);
  Plan zero_on_ep = plan;
  zero_on_ep.zero_axes = {"dp", "ep"};
  EXPECT_NE(validate(zero_on_ep).message().find("ZeRO over the expert axis"), std::string::npos);
  nlohmann::json unknown = plan_to_json(plan);
  unknown["expert_axis"] = "zz";
  EXPECT_NE(plan_from_json(unknown).status().message().find("'zz' is not a mesh axis"),
            std::string::npos);
  Plan not_data = plan;
  not_data.data_axes = {"dp"};
  EXPECT_NE(validate(not_data).message().find("must also be a data axis"), std::string::npos);
  // An expert count the axis does not divide is refused by name.
  ModelConfig c = *find_preset("moe-tiny");
  c.n_experts = 6;
  ModelGraph m = build_model(c, 4, 16, ModelMode::train);
  Plan four = Plan::data_parallel(1);
  ASSERT_TRUE(add_expert_axis(&four, 4).ok());
  Result<Program> p = lower(m.graph, four);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("6 experts"), std::string::npos) << p.status().to_string();
}

}  // namespace
}  // namespace tessera
