// Flavors of a virtual accelerator: a name the user asks for (`small.80gb` ... `48xlarge.30720gb`,
// MoAI's ladder, shipped in clusters/flavors/*.toml and compiled in; a user's TOML file adds more
// or replaces one of the same name), each naming its cluster spec, devices, memory and price.
// `tessera submit --flavor NAME` plans for the flavor's devices on its cluster and asks the
// scheduler for them.
//
//   TS_ASSIGN_OR_RETURN(std::vector<Flavor> all, load_flavors(user_file));  // "" for none
//   TS_ASSIGN_OR_RETURN(Flavor f, find_flavor(all, "xlarge.640gb"));
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace tessera {

struct Flavor {
  std::string name;     // "xlarge.640gb"
  std::string cluster;  // a cluster preset or spec file ("dgx-h100")
  int devices = 1;
  double memory_gb = 0;       // the devices' memory in total
  double price_per_hour = 0;  // dollars per hour of the whole flavor (0: not priced)
};

// The shipped flavors, then those of `user_file` (a TOML of [[flavor]] sections; "" for none),
// ordered by devices. A flavor without `price_per_hour` costs its cluster's
// price_per_device_hour times its devices.
Result<std::vector<Flavor>> load_flavors(const std::string& user_file = "");
// The flavor named `name`, or an error listing the names (with the closest one).
Result<Flavor> find_flavor(const std::vector<Flavor>& flavors, const std::string& name);

}  // namespace tessera
