#include "cost/flavor.h"

#include <algorithm>

#include "cost/cluster_spec.h"
#include "io/toml_config.h"

namespace tessera {

namespace cost_detail {
// Generated at build time from clusters/flavors/*.toml by src/cost/embed_clusters.cmake.
extern const int kNumFlavorPresets;
extern const char* const kFlavorPresetNames[];
extern const char* const kFlavorPresetTexts[];
}  // namespace cost_detail

namespace {

// The [[flavor]] sections of one TOML text, added to `out` (replacing flavors of their names).
Status read_flavors(const TomlTable& root, std::vector<Flavor>* out) {
  TS_RETURN_IF_ERROR(root.check_no_unknown_keys({"flavor"}));
  TS_ASSIGN_OR_RETURN(std::vector<TomlTable> tables, root.table_array("flavor"));
  for (const TomlTable& t : tables) {
    TS_RETURN_IF_ERROR(
        t.check_no_unknown_keys({"name", "cluster", "devices", "memory_gb", "price_per_hour"}));
    Flavor f;
    TS_ASSIGN_OR_RETURN(f.name, t.require_string("name"));
    TS_ASSIGN_OR_RETURN(f.cluster, t.require_string("cluster"));
    TS_ASSIGN_OR_RETURN(const int64_t devices, t.require_int("devices"));
    if (devices < 1 || devices > (1 << 20))
      return t.error_at("devices",
                        "must be a number of devices from 1, got " + std::to_string(devices));
    f.devices = static_cast<int>(devices);
    TS_ASSIGN_OR_RETURN(f.memory_gb, t.get_float("memory_gb", 0));
    TS_ASSIGN_OR_RETURN(f.price_per_hour, t.get_float("price_per_hour", -1));
    if (f.price_per_hour < 0) {  // the cluster's price per device-hour, times the devices
      TS_ASSIGN_OR_RETURN(ClusterSpec c, load_cluster(f.cluster));
      f.price_per_hour = c.price_per_device_hour * f.devices;
    }
    std::erase_if(*out, [&](const Flavor& g) { return g.name == f.name; });
    out->push_back(std::move(f));
  }
  return Status();
}

}  // namespace

Result<std::vector<Flavor>> load_flavors(const std::string& user_file) {
  std::vector<Flavor> all;
  for (int i = 0; i < cost_detail::kNumFlavorPresets; ++i) {
    TS_ASSIGN_OR_RETURN(TomlTable root,
                        parse_toml_string(cost_detail::kFlavorPresetTexts[i],
                                          std::string("clusters/flavors/") +
                                              cost_detail::kFlavorPresetNames[i] + ".toml"));
    TS_RETURN_IF_ERROR(read_flavors(root, &all));
  }
  if (!user_file.empty()) {
    TS_ASSIGN_OR_RETURN(TomlTable root, parse_toml_file(user_file));
    TS_RETURN_IF_ERROR(read_flavors(root, &all));
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const Flavor& a, const Flavor& b) { return a.devices < b.devices; });
  return all;
}

Result<Flavor> find_flavor(const std::vector<Flavor>& flavors, const std::string& name) {
  std::vector<std::string> names;
  for (const Flavor& f : flavors) {
    if (f.name == name) return f;
    names.push_back(f.name);
  }
  const std::string close = closest_match(name, names);
  return error("--flavor '" + name + "' is not a flavor" +
                   (close.empty() ? std::string() : " (did you mean '" + close + "'?)"),
               "flavors: " + join_strings(names) + " (add your own with --flavors FILE)");
}

}  // namespace tessera
