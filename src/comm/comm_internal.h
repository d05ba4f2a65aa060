// Internal to comm/: how the transports (local_comm.cc, mpi_comm.cc) create the root
// communicator of a process, which starts that process's transport and the world's comm thread.
//
//   auto world = detail::make_world_communicator(std::make_unique<MyTransport>(...));
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/host_comm.h"
#include "comm/transport.h"

namespace tessera::detail {

// The "world" communicator over every rank of `transport`, running `algo`'s collectives (the
// ring where the transport has none of its own). The transport lives until this communicator
// and every one split from it are destroyed.
std::unique_ptr<Communicator> make_world_communicator(std::unique_ptr<Transport> transport,
                                                      CollectiveAlgo algo = CollectiveAlgo::ring);

// The transport under a communicator (for test hooks that flip shared flags; do not call
// its methods from outside a comm thread).
Transport* transport_of(const Communicator& comm);

}  // namespace tessera::detail
