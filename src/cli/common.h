// Helpers shared by the subcommands.
#pragma once

#include <cstdlib>
#include <string>

#include "base/status.h"

namespace tessera {

// Prints "error: message\nHINT: hint" and exits 1 when `s` is an error.
void exit_on_error(const Status& s);

}  // namespace tessera
