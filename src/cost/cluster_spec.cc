#include "cost/cluster_spec.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <span>

#include "io/fs.h"
#include "io/toml_config.h"
#include "ir/op.h"

namespace tessera {

// Generated at build time from clusters/*.toml by src/cost/embed_clusters.cmake.
namespace cost_detail {
extern const int kNumClusterPresets;
extern const char* const kClusterPresetNames[];
extern const char* const kClusterPresetTexts[];
}  // namespace cost_detail

double DeviceSpec::peak_flops(DType t) const {
  switch (t) {
    case DType::bf16:
      return peak_flops_bf16 > 0 ? peak_flops_bf16 : peak_flops_f32;
    case DType::f16:
      return peak_flops_f16 > 0 ? peak_flops_f16 : peak_flops_f32;
    case DType::f32:
    case DType::i32:
      return peak_flops_f32;
  }
  return peak_flops_f32;
}

int NodeSpec::ranks_per_node(int ranks) const { return std::max(1, std::min(ranks, devices)); }

double NodeSpec::host_optimizer_rate(int ranks) const {
  return host_memory_bandwidth * host_optimizer_efficiency / ranks_per_node(ranks);
}

double NetworkSpec::node_bandwidth() const {
  return nics * nic_bandwidth * efficiency / oversubscription;
}

int ClusterSpec::nodes_for(int devices) const {
  const int per_node = std::max(node.devices, 1);
  return (devices + per_node - 1) / per_node;
}

namespace {

// ---- The schema: one table drives parsing, validation and serialization ------------------

enum class Range { positive, non_negative, fraction, unit, at_least_one };

// A number stored in SI units and written in the file's unit: si = file * scale, or
// si = file / scale when `divide` (so every scale is an exact integer and values read from a
// file survive a write/read round trip bit for bit).
template <typename S>
struct FloatField {
  const char* key;
  double S::*member;
  double scale;
  bool divide;
  Range range;
  bool required;
  const char* what;  // unit and an example, for error hints
};

template <typename S>
struct IntField {
  const char* key;
  int S::*member;
  int min;
  bool required;
  const char* what;
};

constexpr double kTera = 1e12, kGiga = 1e9, kGiB = 1073741824.0, kMicro = 1e6;
constexpr double kGbitBytes = 1.25e8;  // 1 Gb/s = 1e9 / 8 bytes/s

const FloatField<DeviceSpec> kDeviceFloats[] = {
    {"peak_tflops_f32", &DeviceSpec::peak_flops_f32, kTera, false, Range::positive, true,
     "dense f32 peak in TFLOP/s, e.g. 19.5 for an A100"},
    {"peak_tflops_bf16", &DeviceSpec::peak_flops_bf16, kTera, false, Range::non_negative, false,
     "dense bf16 peak in TFLOP/s, e.g. 312 for an A100 (0: use the f32 peak)"},
    {"peak_tflops_f16", &DeviceSpec::peak_flops_f16, kTera, false, Range::non_negative, false,
     "dense f16 peak in TFLOP/s, e.g. 312 for an A100 (0: use the f32 peak)"},
    {"peak_tflops_fp8", &DeviceSpec::peak_flops_fp8, kTera, false, Range::non_negative, false,
     "dense FP8 tensor-core peak in TFLOP/s, e.g. 1979 for an H100 SXM (0: no FP8)"},
    {"memory_gib", &DeviceSpec::memory_bytes, kGiB, false, Range::positive, true,
     "device memory in GiB, e.g. 80"},
    {"memory_bandwidth_gbs", &DeviceSpec::memory_bandwidth, kGiga, false, Range::positive, true,
     "memory bandwidth in GB/s (1e9 bytes/s), e.g. 2039 for an A100 80GB"},
    {"launch_overhead_us", &DeviceSpec::launch_overhead, kMicro, true, Range::non_negative, false,
     "fixed cost of one kernel in microseconds, e.g. 4"},
    {"gemm_efficiency", &DeviceSpec::gemm_efficiency, 1, false, Range::fraction, false,
     "fraction of peak the best-shaped GEMM reaches, e.g. 0.8"},
    {"unaligned_gemm_efficiency", &DeviceSpec::unaligned_gemm_efficiency, 1, false, Range::fraction,
     false,
     "fraction of a GEMM's rate left when a bf16/f16 dimension is not a multiple of 8, e.g. "
     "0.15 on an H100 (1: no penalty)"},
    {"unaligned_attention_efficiency", &DeviceSpec::unaligned_attention_efficiency, 1, false,
     Range::fraction, false,
     "fraction of an unfused attention's batched-GEMM rate left when a head width is not a "
     "multiple of 8 (at most unaligned_gemm_efficiency), e.g. 0.082 on an A100 (1: as "
     "unaligned_gemm_efficiency)"},
    {"fp8_gemm_efficiency", &DeviceSpec::fp8_gemm_efficiency, 1, false, Range::fraction, false,
     "fraction of the FP8 peak the best-shaped FP8 GEMM reaches, e.g. 0.5"},
    {"memory_efficiency", &DeviceSpec::memory_efficiency, 1, false, Range::fraction, false,
     "fraction of memory bandwidth streaming kernels reach, e.g. 0.8"},
    {"attention_efficiency", &DeviceSpec::attention_efficiency, 1, false, Range::fraction, false,
     "fraction of peak fused attention reaches, e.g. 0.5"},
    {"optimizer_efficiency", &DeviceSpec::optimizer_efficiency, 1, false, Range::fraction, false,
     "fraction of memory bandwidth the AdamW update and gradient accumulation reach, e.g. 0.8"},
};
const IntField<DeviceSpec> kDeviceInts[] = {
    {"sm_count", &DeviceSpec::sm_count, 0, false,
     "streaming multiprocessors / compute units, e.g. 108 (0: no wave quantization)"},
    {"gemm_tile_m", &DeviceSpec::gemm_tile_m, 1, false, "GEMM output tile rows, e.g. 128"},
    {"gemm_tile_n", &DeviceSpec::gemm_tile_n, 1, false, "GEMM output tile columns, e.g. 128"},
};

const FloatField<NodeSpec> kNodeFloats[] = {
    {"intra_bandwidth_gbs", &NodeSpec::intra_bandwidth, kGiga, false, Range::non_negative, false,
     "per-device link bandwidth inside a node in GB/s, one direction, e.g. 300 for NVLink3"},
    {"intra_latency_us", &NodeSpec::intra_latency, kMicro, true, Range::non_negative, false,
     "per-message latency inside a node in microseconds, e.g. 2"},
    {"intra_efficiency", &NodeSpec::intra_efficiency, 1, false, Range::fraction, false,
     "fraction of the intra-node bandwidth collectives reach, e.g. 0.8"},
    {"comm_overlap", &NodeSpec::comm_overlap, 1, false, Range::unit, false,
     "fraction of a collective's time that overlaps compute for free (1 on GPUs; below 1 "
     "where the comm thread shares the compute cores), e.g. 1"},
    {"host_memory_gib", &NodeSpec::host_memory_bytes, kGiB, false, Range::non_negative, false,
     "CPU memory per node in GiB, e.g. 2048 for a DGX H100 (0: unknown)"},
    {"host_memory_bandwidth_gbs", &NodeSpec::host_memory_bandwidth, kGiga, false,
     Range::non_negative, false,
     "CPU memory bandwidth per node in GB/s, e.g. 614 for two sockets of 8 DDR5-4800 channels "
     "(0: unknown; no offload)"},
    {"host_link_gbs", &NodeSpec::host_link_bandwidth, kGiga, false, Range::non_negative, false,
     "host-device link per device in GB/s, one direction, e.g. 64 for PCIe Gen5 x16 (0: "
     "unknown; no offload)"},
    {"host_link_efficiency", &NodeSpec::host_link_efficiency, 1, false, Range::fraction, false,
     "fraction of the host link pinned-memory copies reach, e.g. 0.8"},
    {"host_optimizer_efficiency", &NodeSpec::host_optimizer_efficiency, 1, false, Range::fraction,
     false, "fraction of the host memory bandwidth the CPU's AdamW reaches, e.g. 0.5"},
};
const IntField<NodeSpec> kNodeInts[] = {
    {"devices", &NodeSpec::devices, 1, true, "devices per node, e.g. 8"},
};

const FloatField<NetworkSpec> kNetworkFloats[] = {
    {"nic_gbits", &NetworkSpec::nic_bandwidth, kGbitBytes, false, Range::non_negative, false,
     "bandwidth of one NIC in Gb/s, one direction, e.g. 200 for HDR InfiniBand"},
    {"latency_us", &NetworkSpec::latency, kMicro, true, Range::non_negative, false,
     "per-message latency between nodes in microseconds, e.g. 5"},
    {"efficiency", &NetworkSpec::efficiency, 1, false, Range::fraction, false,
     "fraction of NIC bandwidth collectives reach, e.g. 0.9 for InfiniBand, 0.6 for TCP"},
    {"oversubscription", &NetworkSpec::oversubscription, 1, false, Range::at_least_one, false,
     "fabric taper above a leaf switch, 1 for non-blocking"},
};
const IntField<NetworkSpec> kNetworkInts[] = {
    {"nics", &NetworkSpec::nics, 0, false, "NICs per node, e.g. 8 (0: a single node)"},
};

// Appends the field's description to a getter's error hint.
Status with_hint(const Status& s, const char* what) {
  return Status::error(s.message(), s.hint().empty() ? "set it to the " + std::string(what)
                                                     : s.hint() + "; expected the " + what);
}

double to_si(double v, double scale, bool divide) { return divide ? v / scale : v * scale; }

// The file value that reads back as exactly `si` (searching a few ulps around the naive
// inverse); the naive inverse when no such value exists.
double from_si(double si, double scale, bool divide) {
  const double v = divide ? si * scale : si / scale;
  if (to_si(v, scale, divide) == si) return v;
  double lo = v, hi = v;
  for (int i = 0; i < 8; ++i) {
    lo = std::nextafter(lo, -std::numeric_limits<double>::infinity());
    if (to_si(lo, scale, divide) == si) return lo;
    hi = std::nextafter(hi, std::numeric_limits<double>::infinity());
    if (to_si(hi, scale, divide) == si) return hi;
  }
  return v;
}

std::string range_text(Range r) {
  switch (r) {
    case Range::positive:
      return "must be a finite number > 0";
    case Range::non_negative:
      return "must be a finite number >= 0";
    case Range::fraction:
      return "must be a fraction in (0, 1]";
    case Range::unit:
      return "must be in [0, 1]";
    case Range::at_least_one:
      return "must be >= 1";
  }
  return "";
}

bool in_range(double v, Range r) {
  if (!std::isfinite(v)) return false;
  switch (r) {
    case Range::positive:
      return v > 0;
    case Range::non_negative:
      return v >= 0;
    case Range::fraction:
      return v > 0 && v <= 1;
    case Range::unit:
      return v >= 0 && v <= 1;
    case Range::at_least_one:
      return v >= 1;
  }
  return false;
}

std::string number_text(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest exact representation
  std::string s(buf, ec == std::errc() ? end : buf);
  // TOML reads "312" as an integer; keep it a float so huge values cannot overflow int64.
  if (s.find_first_of(".eEni") == std::string::npos) s += ".0";
  return s;
}

template <typename S>
Status read_floats(const TomlTable& t, std::span<const FloatField<S>> fields, S* out) {
  for (const FloatField<S>& f : fields) {
    if (!f.required && !t.has(f.key)) continue;
    Result<double> r = f.required ? t.require_float(f.key) : t.get_float(f.key, 0);
    if (!r.ok()) return with_hint(r.status(), f.what);
    if (!in_range(r.value(), f.range)) {
      return t.error_at(f.key, range_text(f.range) + ", got " + number_text(r.value()),
                        std::string("set it to the ") + f.what);
    }
    out->*f.member = to_si(r.value(), f.scale, f.divide);
  }
  return Status();
}

template <typename S>
Status read_ints(const TomlTable& t, std::span<const IntField<S>> fields, S* out) {
  for (const IntField<S>& f : fields) {
    if (!f.required && !t.has(f.key)) continue;
    Result<int64_t> r = f.required ? t.require_int(f.key) : t.get_int(f.key, 0);
    if (!r.ok()) return with_hint(r.status(), f.what);
    if (r.value() < f.min || r.value() > INT_MAX) {
      return t.error_at(
          f.key,
          "must be an integer >= " + std::to_string(f.min) + ", got " + std::to_string(r.value()),
          std::string("set it to the ") + f.what);
    }
    out->*f.member = static_cast<int>(r.value());
  }
  return Status();
}

// The keys a section accepts: its fields plus `extra`.
template <typename S>
std::vector<std::string> known_keys(std::span<const FloatField<S>> floats,
                                    std::span<const IntField<S>> ints,
                                    std::vector<std::string> extra) {
  for (const FloatField<S>& f : floats) extra.push_back(f.key);
  for (const IntField<S>& f : ints) extra.push_back(f.key);
  return extra;
}

std::vector<std::string> all_op_names() {
  std::vector<std::string> names;
  for (OpKind k : all_ops()) names.push_back(op_name(k));
  return names;
}

Status read_op_efficiency(const TomlTable& t, std::map<std::string, double>* out) {
  for (const std::string& key : t.keys()) {
    OpKind kind;
    if (!op_from_name(key, &kind)) {
      std::string near = closest_match(key, all_op_names());
      return t.error_at(key,
                        "is not an op name: keys in [efficiency] must be op names" +
                            (near.empty() ? std::string() : " (did you mean '" + near + "'?)"),
                        "op names: " + join_strings(all_op_names()));
    }
    TS_ASSIGN_OR_RETURN(double v, t.get_float(key, 0));
    // Above 1 is allowed here: an op whose tensors stay in cache beats the streaming bandwidth
    // of the roofline (measured on CPUs by `tessera calibrate`).
    if (!(v > 0 && v <= 100)) {
      return t.error_at(
          key, "must be a positive ratio of at most 100, got " + number_text(v),
          "the ratio of its roofline time to the time op '" + key + "' takes, e.g. 0.7");
    }
    (*out)[key] = v;
  }
  return Status();
}

// ---- Writing -----------------------------------------------------------------------------

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

template <typename S>
void write_fields(const S& s, std::span<const IntField<S>> ints,
                  std::span<const FloatField<S>> floats, std::string* out) {
  for (const IntField<S>& f : ints)
    *out += std::string(f.key) + " = " + std::to_string(s.*f.member) + "\n";
  for (const FloatField<S>& f : floats) {
    *out +=
        std::string(f.key) + " = " + number_text(from_si(s.*f.member, f.scale, f.divide)) + "\n";
  }
}

}  // namespace

Result<ClusterSpec> parse_cluster_spec(const std::string& toml_text, const std::string& source) {
  TS_ASSIGN_OR_RETURN(TomlTable root, parse_toml_string(toml_text, source));
  TS_RETURN_IF_ERROR(root.check_no_unknown_keys(
      {"name", "description", "price_per_device_hour", "device", "node", "network", "efficiency"}));
  ClusterSpec c;
  TS_ASSIGN_OR_RETURN(c.name, root.require_string("name"));
  if (c.name.empty()) return root.error_at("name", "must not be empty", "name the cluster");
  TS_ASSIGN_OR_RETURN(c.description, root.get_string("description", ""));
  TS_ASSIGN_OR_RETURN(c.price_per_device_hour, root.get_float("price_per_device_hour", 0));
  if (!in_range(c.price_per_device_hour, Range::non_negative)) {
    return root.error_at("price_per_device_hour",
                         "must be >= 0, got " + number_text(c.price_per_device_hour),
                         "the price of one device for one hour, 0 when unknown");
  }

  TS_ASSIGN_OR_RETURN(TomlTable device, root.require_table("device"));
  TS_RETURN_IF_ERROR(
      device.check_no_unknown_keys(known_keys<DeviceSpec>(kDeviceFloats, kDeviceInts, {"name"})));
  TS_ASSIGN_OR_RETURN(c.device.name, device.get_string("name", ""));
  TS_RETURN_IF_ERROR(read_floats<DeviceSpec>(device, kDeviceFloats, &c.device));
  TS_RETURN_IF_ERROR(read_ints<DeviceSpec>(device, kDeviceInts, &c.device));

  TS_ASSIGN_OR_RETURN(TomlTable node, root.require_table("node"));
  TS_RETURN_IF_ERROR(node.check_no_unknown_keys(known_keys<NodeSpec>(kNodeFloats, kNodeInts, {})));
  TS_RETURN_IF_ERROR(read_ints<NodeSpec>(node, kNodeInts, &c.node));
  TS_RETURN_IF_ERROR(read_floats<NodeSpec>(node, kNodeFloats, &c.node));
  if (c.node.devices > 1 && c.node.intra_bandwidth <= 0) {
    return node.error_at("intra_bandwidth_gbs",
                         "must be > 0 when devices = " + std::to_string(c.node.devices),
                         "set it to the per-device link bandwidth inside a node in GB/s, one "
                         "direction (e.g. 300 for NVLink3), or set devices = 1");
  }

  TS_ASSIGN_OR_RETURN(TomlTable network, root.table("network"));
  TS_RETURN_IF_ERROR(network.check_no_unknown_keys(
      known_keys<NetworkSpec>(kNetworkFloats, kNetworkInts, {"topology"})));
  TS_RETURN_IF_ERROR(read_ints<NetworkSpec>(network, kNetworkInts, &c.network));
  TS_RETURN_IF_ERROR(read_floats<NetworkSpec>(network, kNetworkFloats, &c.network));
  std::vector<std::string> topologies(std::begin(kNetworkTopologies), std::end(kNetworkTopologies));
  TS_ASSIGN_OR_RETURN(c.network.topology,
                      network.get_choice("topology", topologies, c.network.topology));
  if (c.network.nics > 0 && c.network.nic_bandwidth <= 0) {
    return network.error_at("nic_gbits",
                            "must be > 0 when nics = " + std::to_string(c.network.nics),
                            "set it to the bandwidth of one NIC in Gb/s (e.g. 200 for HDR "
                            "InfiniBand), or set nics = 0 for a single-node cluster");
  }

  TS_ASSIGN_OR_RETURN(TomlTable efficiency, root.table("efficiency"));
  TS_RETURN_IF_ERROR(read_op_efficiency(efficiency, &c.op_efficiency));
  return c;
}

std::string cluster_spec_to_toml(const ClusterSpec& c) {
  std::string out = "# Cluster spec; the layout is documented in src/cost/cluster_spec.h.\n";
  out += "name = " + quoted(c.name) + "\n";
  out += "description = " + quoted(c.description) + "\n";
  out += "price_per_device_hour = " + number_text(c.price_per_device_hour) + "\n";
  out += "\n[device]\nname = " + quoted(c.device.name) + "\n";
  write_fields<DeviceSpec>(c.device, kDeviceInts, kDeviceFloats, &out);
  out += "\n[node]\n";
  write_fields<NodeSpec>(c.node, kNodeInts, kNodeFloats, &out);
  out += "\n[network]\n";
  write_fields<NetworkSpec>(c.network, kNetworkInts, kNetworkFloats, &out);
  out += "topology = " + quoted(c.network.topology) + "\n";
  if (!c.op_efficiency.empty()) {
    out += "\n[efficiency]\n";
    for (const auto& [op, v] : c.op_efficiency) out += op + " = " + number_text(v) + "\n";
  }
  return out;
}

std::vector<std::string> cluster_presets() {
  std::vector<std::string> names(
      cost_detail::kClusterPresetNames,
      cost_detail::kClusterPresetNames + cost_detail::kNumClusterPresets);
  std::sort(names.begin(), names.end());
  return names;
}

std::string cluster_preset_text(const std::string& name) {
  for (int i = 0; i < cost_detail::kNumClusterPresets; ++i) {
    if (name == cost_detail::kClusterPresetNames[i]) return cost_detail::kClusterPresetTexts[i];
  }
  return "";
}

std::optional<DeviceSpec> datasheet_device(const std::string& product) {
  auto has = [&](const char* s) { return product.find(s) != std::string::npos; };
  // (product name parts, the preset holding that GPU)
  const char* preset = has("H200")                                  ? "dgx-h100"
                       : has("H100") && (has("HBM3") || has("SXM")) ? "dgx-h100"
                       : has("A100") && has("40GB")                 ? "dgx-a100-40gb"
                       : has("A100")                                ? "dgx-a100"
                       : has("V100")                                ? "v100-dgx2"
                       : has("MI250X")                              ? "frontier"
                       : has("MI250")                               ? "mi250-hdr"
                                                                    : nullptr;
  if (preset == nullptr) return std::nullopt;
  Result<ClusterSpec> c = load_cluster(preset);
  if (!c.ok()) return std::nullopt;
  DeviceSpec d = c->device;
  if (has("H200")) d.name = "H200 (" + d.name + " tensor cores)";
  return d;
}

Result<ClusterSpec> load_cluster(const std::string& name_or_path) {
  const std::string preset = cluster_preset_text(name_or_path);
  if (!preset.empty()) return parse_cluster_spec(preset, "clusters/" + name_or_path + ".toml");
  std::error_code ec;
  const bool is_toml =
      name_or_path.size() > 5 && name_or_path.compare(name_or_path.size() - 5, 5, ".toml") == 0;
  if (is_toml || std::filesystem::is_regular_file(name_or_path, ec)) {
    TS_ASSIGN_OR_RETURN(std::string text, read_file(name_or_path));
    return parse_cluster_spec(text, name_or_path);
  }
  const std::vector<std::string> presets = cluster_presets();
  const std::string near = closest_match(name_or_path, presets);
  return error("unknown cluster '" + name_or_path + "'" +
                   (near.empty() ? "" : " (did you mean '" + near + "'?)"),
               "give a preset name (" + join_strings(presets) +
                   ") or a path to a .toml file in the layout of clusters/dgx-a100.toml");
}

double flops_per_intra_byte(const ClusterSpec& c, DType precision) {
  return c.device.peak_flops(precision) / (c.node.intra_bandwidth * c.node.intra_efficiency);
}

}  // namespace tessera
