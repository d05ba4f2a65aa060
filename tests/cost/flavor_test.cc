// The shipped flavors (clusters/flavors/moai.toml): MoAI's ladder on H100 nodes, priced from the
// cluster spec; a user's file adds and replaces; bad entries are named.
#include "cost/flavor.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cost/cluster_spec.h"

namespace tessera {
namespace {

TEST(Flavor, TheShippedLadderIsMoaisOnH100Nodes) {
  Result<std::vector<Flavor>> all = load_flavors();
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  std::vector<std::pair<std::string, int>> got;
  for (const Flavor& f : *all) got.emplace_back(f.name, f.devices);
  const std::vector<std::pair<std::string, int>> want = {
      {"small.80gb", 1},      {"medium.160gb", 2},       {"large.320gb", 4},
      {"xlarge.640gb", 8},    {"2xlarge.1280gb", 16},    {"4xlarge.2560gb", 32},
      {"8xlarge.5120gb", 64}, {"16xlarge.10240gb", 128}, {"48xlarge.30720gb", 384}};
  EXPECT_EQ(got, want);
  const ClusterSpec h100 = load_cluster("dgx-h100").value();
  for (const Flavor& f : *all) {
    EXPECT_EQ(f.cluster, "dgx-h100");
    EXPECT_DOUBLE_EQ(f.memory_gb, 80.0 * f.devices) << f.name;
    EXPECT_DOUBLE_EQ(f.price_per_hour, h100.price_per_device_hour * f.devices) << f.name;
  }
}

TEST(Flavor, AUsersFileAddsReplacesAndIsChecked) {
  const std::string path = ::testing::TempDir() + "flavors_test.toml";
  std::ofstream(path) << "[[flavor]]\nname = \"small.80gb\"\ncluster = \"dgx-a100\"\n"
                         "devices = 1\nprice_per_hour = 2.5\n\n[[flavor]]\nname = \"mine\"\n"
                         "cluster = \"dgx-a100\"\ndevices = 3\n";
  Result<std::vector<Flavor>> all = load_flavors(path);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  const Flavor small = find_flavor(*all, "small.80gb").value();
  EXPECT_EQ(small.cluster, "dgx-a100");
  EXPECT_DOUBLE_EQ(small.price_per_hour, 2.5);
  EXPECT_EQ(find_flavor(*all, "mine").value().devices, 3);
  Result<Flavor> missing = find_flavor(*all, "small.80g");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("did you mean 'small.80gb'"), std::string::npos)
      << missing.status().message();
  std::ofstream(path) << "[[flavor]]\nname = \"x\"\ncluster = \"dgx-a100\"\ndevices = 0\n";
  EXPECT_NE(load_flavors(path).status().message().find("devices"), std::string::npos);
  std::ofstream(path)
      << "[[flavor]]\nname = \"x\"\ncluster = \"dgx-a100\"\ndevices = 2\ngpus = 2\n";
  EXPECT_NE(load_flavors(path).status().message().find("gpus"), std::string::npos);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace tessera
