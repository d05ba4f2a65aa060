#include "cost/cluster_spec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>

#include "io/fs.h"

namespace tessera {
namespace {

// A small valid spec; tests append or replace lines to break it.
const char* kMinimal = R"(name = "tiny"
[device]
peak_tflops_f32 = 1.5
memory_gib = 16
memory_bandwidth_gbs = 500
[node]
devices = 4
intra_bandwidth_gbs = 50
[network]
nics = 2
nic_gbits = 100
)";

std::string replace(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// The error of parsing `text`, as "message\nHINT: hint"; "" when it parses.
std::string parse_error(const std::string& text) {
  Result<ClusterSpec> r = parse_cluster_spec(text, "test.toml");
  return r.ok() ? "" : r.status().to_string();
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

ClusterSpec load_ok(const std::string& name) {
  Result<ClusterSpec> r = load_cluster(name);
  EXPECT_TRUE(r.ok()) << name << ": " << r.status().to_string();
  return r.ok() ? r.value() : ClusterSpec{};
}

TEST(ClusterSpec, ShipsThePresets) {
  std::vector<std::string> expected = {"a100-ethernet", "cpu-local", "dgx-a100",  "dgx-a100-40gb",
                                       "dgx-h100",      "frontier",  "mi250-hdr", "v100-dgx2"};
  EXPECT_EQ(cluster_presets(), expected);
  EXPECT_EQ(cluster_preset_text("no-such-cluster"), "");
}

TEST(ClusterSpec, EveryPresetParsesWithPositiveNumbers) {
  for (const std::string& name : cluster_presets()) {
    SCOPED_TRACE(name);
    ClusterSpec c = load_ok(name);
    EXPECT_EQ(c.name, name);  // the file's name = key matches its file name
    EXPECT_FALSE(c.description.empty());
    EXPECT_FALSE(c.device.name.empty());
    for (DType t : {DType::f32, DType::bf16, DType::f16}) EXPECT_GT(c.device.peak_flops(t), 0);
    EXPECT_GT(c.device.memory_bytes, 0);
    EXPECT_GT(c.device.memory_bandwidth, 0);
    EXPECT_GT(c.device.launch_overhead, 0);
    for (double e :
         {c.device.gemm_efficiency, c.device.memory_efficiency, c.device.attention_efficiency,
          c.device.optimizer_efficiency, c.node.intra_efficiency, c.network.efficiency}) {
      EXPECT_GT(e, 0);
      EXPECT_LE(e, 1);
    }
    EXPECT_GE(c.node.devices, 1);
    EXPECT_GT(c.node.intra_bandwidth, 0);
    if (c.network.nics > 0) {
      EXPECT_GT(c.network.node_bandwidth(), 0);
    }
    EXPECT_GE(c.price_per_device_hour, 0);
  }
}

TEST(ClusterSpec, EmbeddedPresetsMatchTheFilesInClusters) {
  std::vector<std::string> on_disk;
  for (const auto& e : std::filesystem::directory_iterator(TESSERA_SOURCE_DIR "/clusters")) {
    if (e.path().extension() != ".toml") continue;
    const std::string name = e.path().stem().string();
    on_disk.push_back(name);
    Result<std::string> text = read_file(e.path().string());
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    EXPECT_EQ(cluster_preset_text(name), text.value()) << name << " is stale: rebuild";
  }
  std::sort(on_disk.begin(), on_disk.end());
  EXPECT_EQ(on_disk, cluster_presets());
}

TEST(ClusterSpec, DgxA100MatchesTheDatasheet) {
  ClusterSpec c = load_ok("dgx-a100");
  // A100 SXM4 80GB datasheet: 312 TFLOP/s bf16 dense, 19.5 f32, 80 GB HBM2e at 2039 GB/s.
  EXPECT_DOUBLE_EQ(c.device.peak_flops(DType::bf16), 312e12);
  EXPECT_DOUBLE_EQ(c.device.peak_flops(DType::f16), 312e12);
  EXPECT_DOUBLE_EQ(c.device.peak_flops(DType::f32), 19.5e12);
  EXPECT_DOUBLE_EQ(c.device.memory_bytes, 80.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(c.device.memory_bandwidth, 2039e9);
  EXPECT_DOUBLE_EQ(c.device.launch_overhead, 4e-6);
  EXPECT_EQ(c.device.sm_count, 108);
  // NVLink3 600 GB/s bidirectional = 300 GB/s per direction; 8 GPUs per node.
  EXPECT_EQ(c.node.devices, 8);
  EXPECT_DOUBLE_EQ(c.node.intra_bandwidth, 300e9);
  // 8x HDR 200 Gb/s = 25 GB/s per NIC; usable = 8 * 25e9 * efficiency.
  EXPECT_EQ(c.network.nics, 8);
  EXPECT_DOUBLE_EQ(c.network.nic_bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(c.network.node_bandwidth(), 8 * 25e9 * c.network.efficiency);
  EXPECT_DOUBLE_EQ(c.network.efficiency, 0.9);
  EXPECT_EQ(c.network.topology, "fat-tree");
  EXPECT_EQ(c.nodes_for(1024), 128);
  EXPECT_EQ(c.nodes_for(8), 1);
  EXPECT_EQ(c.nodes_for(9), 2);
  EXPECT_EQ(c.nodes_for(1), 1);
}

// The datasheet a driver's product name points to: the presets' GPUs (an H200 with the H100
// SXM's tensor cores), nothing for a GPU no preset holds or for the CPU.
TEST(ClusterSpec, DatasheetDeviceByProductName) {
  const std::pair<const char*, const char*> known[] = {
      {"NVIDIA H100 80GB HBM3 (sm_90)", "H100-SXM5-80GB"},
      {"NVIDIA A100-SXM4-80GB (sm_80)", "A100-SXM4-80GB"},
      {"NVIDIA A100-SXM4-40GB (sm_80)", "A100-SXM4-40GB"},
      {"Tesla V100-SXM3-32GB", "V100-SXM3-32GB"},
      {"AMD Instinct MI250X", "MI250X-GCD"}};
  for (const auto& [product, name] : known) {
    std::optional<DeviceSpec> d = datasheet_device(product);
    ASSERT_TRUE(d.has_value()) << product;
    EXPECT_EQ(d->name, name) << product;
  }
  std::optional<DeviceSpec> h200 = datasheet_device("NVIDIA H200 (sm_90)");
  ASSERT_TRUE(h200.has_value());
  EXPECT_EQ(h200->name, "H200 (H100-SXM5-80GB tensor cores)");
  EXPECT_DOUBLE_EQ(h200->peak_flops(DType::bf16), load_cluster("dgx-h100")->device.peak_flops_bf16);
  EXPECT_GT(h200->peak_flops(DType::bf16), 9e14);
  for (const char* unknown : {"NVIDIA H100 PCIe (sm_90)", "cpu", ""})
    EXPECT_FALSE(datasheet_device(unknown).has_value()) << unknown;
}

TEST(ClusterSpec, OtherPresetHeadlineNumbers) {
  EXPECT_DOUBLE_EQ(load_ok("dgx-a100-40gb").device.memory_bandwidth, 1555e9);
  ClusterSpec h = load_ok("dgx-h100");
  EXPECT_DOUBLE_EQ(h.device.peak_flops(DType::bf16), 989e12);
  EXPECT_DOUBLE_EQ(h.network.nic_bandwidth, 50e9);             // NDR 400 Gb/s
  EXPECT_DOUBLE_EQ(h.device.unaligned_gemm_efficiency, 0.15);  // measured on an H100
  // The A100's plain GEMMs are not measured; its unfused attention's batched GEMMs run at about
  // its FP32 rate (BigScience's head-count A/B runs agree).
  for (const char* a100 : {"dgx-a100", "dgx-a100-40gb", "a100-ethernet"}) {
    EXPECT_DOUBLE_EQ(load_ok(a100).device.unaligned_gemm_efficiency, 1.0) << a100;
    EXPECT_DOUBLE_EQ(load_ok(a100).device.unaligned_attention_efficiency, 0.082) << a100;
  }
  EXPECT_DOUBLE_EQ(h.device.unaligned_attention_efficiency, 1.0);  // as its GEMMs
  ClusterSpec f = load_ok("frontier");
  EXPECT_DOUBLE_EQ(f.device.peak_flops(DType::bf16), 191.5e12);  // 383 / 2 GCDs
  EXPECT_DOUBLE_EQ(f.network.node_bandwidth(), 4 * 25e9 * f.network.efficiency);
  EXPECT_EQ(f.network.topology, "dragonfly");
  // V100 has no bf16: falls back to the f32 peak.
  EXPECT_DOUBLE_EQ(load_ok("v100-dgx2").device.peak_flops(DType::bf16), 15.7e12);
  EXPECT_EQ(load_ok("v100-dgx2").node.devices, 16);
  // a100-ethernet: 2 x 100 Gb/s at 0.6 = 120 Gb/s = 15 GB/s usable per node.
  EXPECT_DOUBLE_EQ(load_ok("a100-ethernet").network.node_bandwidth(), 15e9);
  EXPECT_EQ(load_ok("cpu-local").network.nics, 0);
  EXPECT_DOUBLE_EQ(load_ok("cpu-local").network.node_bandwidth(), 0);
}

TEST(ClusterSpec, DefaultsApplyToOptionalKeys) {
  Result<ClusterSpec> r = parse_cluster_spec(kMinimal, "test.toml");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ClusterSpec& c = r.value();
  EXPECT_DOUBLE_EQ(c.device.peak_flops(DType::bf16), 1.5e12);  // bf16 absent: f32 peak
  EXPECT_EQ(c.device.gemm_efficiency, DeviceSpec{}.gemm_efficiency);
  EXPECT_EQ(c.network.topology, "fat-tree");
  EXPECT_DOUBLE_EQ(c.network.nic_bandwidth, 12.5e9);
  EXPECT_TRUE(c.op_efficiency.empty());
  EXPECT_EQ(c.nodes_for(10), 3);
}

TEST(ClusterSpec, ToTomlRoundTripsEveryPreset) {
  for (const std::string& name : cluster_presets()) {
    SCOPED_TRACE(name);
    ClusterSpec c = load_ok(name);
    const std::string text = cluster_spec_to_toml(c);
    Result<ClusterSpec> back = parse_cluster_spec(text, name + " (round trip)");
    ASSERT_TRUE(back.ok()) << back.status().to_string() << "\n" << text;
    EXPECT_TRUE(back.value() == c) << text;
  }
}

TEST(ClusterSpec, ToTomlRoundTripsEveryField) {
  ClusterSpec c;
  c.name = "calibrated \"lab\" box";
  c.description = "two\\three\nlines";
  c.price_per_device_hour = 1.2345;
  c.device = {.name = "cpu",
              .peak_flops_f32 = 8.123456789e10,
              .peak_flops_bf16 = 1.7e11,
              .peak_flops_f16 = 1.9e11,
              .peak_flops_fp8 = 3.7e11,
              .memory_bytes = 3.3e10,
              .memory_bandwidth = 1.23456789e10,
              .launch_overhead = 4.7e-6,
              .gemm_efficiency = 0.91,
              .unaligned_gemm_efficiency = 0.5,
              .fp8_gemm_efficiency = 0.57,
              .memory_efficiency = 0.83,
              .attention_efficiency = 0.37,
              .optimizer_efficiency = 0.66,
              .sm_count = 7,
              .gemm_tile_m = 64,
              .gemm_tile_n = 32};
  c.node = {3, 2.2e9, 1.3e-5, 0.77, 0.4};
  c.network = {5, 1.25e10, 7.1e-6, 0.65, "torus", 2.5};
  c.op_efficiency = {{"matmul", 0.71}, {"layernorm", 0.33}};
  const std::string text = cluster_spec_to_toml(c);
  Result<ClusterSpec> back = parse_cluster_spec(text, "round trip");
  ASSERT_TRUE(back.ok()) << back.status().to_string() << "\n" << text;
  EXPECT_TRUE(back.value() == c) << text;
  EXPECT_EQ(back.value().network.topology, "torus");
  EXPECT_EQ(back.value().op_efficiency.at("matmul"), 0.71);
}

TEST(ClusterSpec, ToTomlRoundTripsArbitraryFileValues) {
  // Every unit conversion (TFLOP/s, GiB, GB/s, Gb/s, us) on 17-digit values.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.001, 5000);
  for (int i = 0; i < 300; ++i) {
    char text[1024];
    std::snprintf(text, sizeof text,
                  "name = \"r\"\n[device]\npeak_tflops_f32 = %.17g\npeak_tflops_bf16 = %.17g\n"
                  "memory_gib = %.17g\nmemory_bandwidth_gbs = %.17g\nlaunch_overhead_us = %.17g\n"
                  "[node]\ndevices = 2\nintra_bandwidth_gbs = %.17g\nintra_latency_us = %.17g\n"
                  "[network]\nnics = 1\nnic_gbits = %.17g\nlatency_us = %.17g\n",
                  u(rng), u(rng), u(rng), u(rng), u(rng), u(rng), u(rng), u(rng), u(rng));
    Result<ClusterSpec> c = parse_cluster_spec(text, "random");
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    Result<ClusterSpec> back = parse_cluster_spec(cluster_spec_to_toml(c.value()), "back");
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    ASSERT_TRUE(back.value() == c.value()) << text << "\n" << cluster_spec_to_toml(back.value());
  }
}

TEST(ClusterSpec, UnknownKeysAreRefusedByName) {
  std::string e = parse_error(replace(kMinimal, "peak_tflops_f32", "peak_tflop_f32"));
  EXPECT_TRUE(contains(e, "test.toml")) << e;
  EXPECT_TRUE(contains(e, "unknown key 'peak_tflop_f32' in [device]")) << e;
  EXPECT_TRUE(contains(e, "did you mean 'peak_tflops_f32'")) << e;
  e = parse_error(std::string("colour = \"red\"\n") + kMinimal);
  EXPECT_TRUE(contains(e, "unknown key 'colour' at the top level")) << e;
  e = parse_error(std::string(kMinimal) + "bandwidth = 3\n");
  EXPECT_TRUE(contains(e, "unknown key 'bandwidth' in [network]")) << e;
}

TEST(ClusterSpec, OutOfRangeValuesNameTheKeyAndTheFix) {
  std::string e = parse_error(replace(kMinimal, "[node]", "gemm_efficiency = 1.5\n[node]"));
  EXPECT_TRUE(contains(e, "key 'device.gemm_efficiency' must be a fraction in (0, 1], got 1.5"))
      << e;
  EXPECT_TRUE(contains(e, "HINT:")) << e;
  e = parse_error(replace(kMinimal, "[node]", "memory_efficiency = 0\n[node]"));
  EXPECT_TRUE(contains(e, "device.memory_efficiency")) << e;
  e = parse_error(replace(kMinimal, "peak_tflops_f32 = 1.5", "peak_tflops_f32 = -1"));
  EXPECT_TRUE(contains(e, "key 'device.peak_tflops_f32' must be a finite number > 0, got -1")) << e;
  e = parse_error(replace(kMinimal, "peak_tflops_f32 = 1.5", "peak_tflops_f32 = \"fast\""));
  EXPECT_TRUE(contains(e, "device.peak_tflops_f32")) << e;
  e = parse_error(replace(kMinimal, "devices = 4", "devices = 0"));
  EXPECT_TRUE(contains(e, "key 'node.devices' must be an integer >= 1, got 0")) << e;
  e = parse_error(replace(kMinimal, "memory_gib = 16\n", ""));
  EXPECT_TRUE(contains(e, "device.memory_gib")) << e;
  e = parse_error(std::string(kMinimal) + "oversubscription = 0.5\n");
  EXPECT_TRUE(contains(e, "network.oversubscription' must be >= 1")) << e;
  e = parse_error(std::string(kMinimal) + "topology = \"fat_tree\"\n");
  EXPECT_TRUE(contains(e, "network.topology")) << e;
  EXPECT_TRUE(contains(e, "fat-tree")) << e;
}

TEST(ClusterSpec, ConsistencyChecks) {
  std::string e = parse_error(replace(kMinimal, "nic_gbits = 100", "nic_gbits = 0"));
  EXPECT_TRUE(contains(e, "key 'network.nic_gbits' must be > 0 when nics = 2")) << e;
  EXPECT_TRUE(contains(e, "nics = 0")) << e;
  // nics = 0 is a single-node cluster: no NIC bandwidth needed.
  EXPECT_EQ(parse_error(replace(replace(kMinimal, "nic_gbits = 100", "nic_gbits = 0"), "nics = 2",
                                "nics = 0")),
            "");
  e = parse_error(replace(kMinimal, "intra_bandwidth_gbs = 50\n", ""));
  EXPECT_TRUE(contains(e, "node.intra_bandwidth_gbs' must be > 0 when devices = 4")) << e;
  EXPECT_EQ(parse_error(replace(replace(kMinimal, "intra_bandwidth_gbs = 50\n", ""), "devices = 4",
                                "devices = 1")),
            "");
}

TEST(ClusterSpec, EfficiencyTableTakesOpNames) {
  Result<ClusterSpec> r = parse_cluster_spec(
      std::string(kMinimal) + "[efficiency]\nmatmul = 0.7\nsoftmax = 0.4\n", "t");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().op_efficiency.size(), 2u);
  EXPECT_DOUBLE_EQ(r.value().op_efficiency.at("matmul"), 0.7);

  std::string e = parse_error(std::string(kMinimal) + "[efficiency]\nmatmull = 0.7\n");
  EXPECT_TRUE(contains(e, "key 'efficiency.matmull' is not an op name")) << e;
  EXPECT_TRUE(contains(e, "must be op names")) << e;
  EXPECT_TRUE(contains(e, "did you mean 'matmul'")) << e;
  EXPECT_TRUE(contains(e, "attention")) << e;  // the hint lists the op names
  e = parse_error(std::string(kMinimal) + "[efficiency]\nmatmul = 0\n");
  EXPECT_TRUE(contains(e, "efficiency.matmul' must be a positive ratio of at most 100")) << e;
  // Above 1 is a cache-resident CPU op beating the streaming bandwidth (tessera calibrate).
  Result<ClusterSpec> fast =
      parse_cluster_spec(std::string(kMinimal) + "[efficiency]\nadd = 2.5\n", "fast.toml");
  ASSERT_TRUE(fast.ok()) << fast.status().to_string();
  EXPECT_DOUBLE_EQ(fast.value().op_efficiency.at("add"), 2.5);
}

TEST(ClusterSpec, UnknownPresetListsThePresets) {
  Result<ClusterSpec> r = load_cluster("dgx-a1000");
  ASSERT_FALSE(r.ok());
  const std::string e = r.status().to_string();
  EXPECT_TRUE(contains(e, "unknown cluster 'dgx-a1000'")) << e;
  EXPECT_TRUE(contains(e, "did you mean 'dgx-a100'")) << e;
  for (const std::string& name : cluster_presets()) EXPECT_TRUE(contains(e, name)) << e;
  EXPECT_TRUE(contains(e, ".toml")) << e;
}

TEST(ClusterSpec, LoadsAFile) {
  const std::string dir = std::filesystem::temp_directory_path().string() +
                          "/tessera_cluster_spec_test-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  ClusterSpec c = load_ok("dgx-h100");
  c.name = "my-cluster";
  c.network.nics = 4;
  const std::string path = dir + "/my_cluster.toml";
  ASSERT_TRUE(write_file_atomic(path, cluster_spec_to_toml(c)).ok());
  Result<ClusterSpec> r = load_cluster(path);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r.value() == c);

  // A file without the .toml suffix loads too; errors in a file name the file.
  const std::string bare = dir + "/spec";
  ASSERT_TRUE(write_file_atomic(bare, std::string(kMinimal) + "typo = 1\n").ok());
  r = load_cluster(bare);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), bare)) << r.status().to_string();

  // A missing .toml path is reported as a missing file, not as an unknown preset.
  r = load_cluster(dir + "/missing.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "missing.toml")) << r.status().to_string();
  EXPECT_FALSE(contains(r.status().message(), "unknown cluster")) << r.status().to_string();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
