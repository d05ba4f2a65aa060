// In-process communicators for unit tests: the n ranks of one world are threads of this
// process, exchanging through shared mailboxes; each rank's communicators have their own comm
// threads, as a process's would. Drive rank r from its own thread (collectives block until all take
// part).
//
//   auto comms = make_local_comms(4);
//   std::vector<std::thread> ranks;
//   for (int r = 0; r < 4; ++r)
//     ranks.emplace_back([&, r] { Status s = comms[r]->wait(comms[r]->all_reduce(x[r], n, "t"));
//     });
//   for (auto& t : ranks) t.join();
//
//   comms[1]->set_timeout(0.5);
//   kill_local_rank(*comms[1]);  // rank 1 "dies": whatever it sends from now on vanishes
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace tessera {

std::vector<std::unique_ptr<Communicator>> make_local_comms(int n);

// Simulates the death of the rank owning `comm` (any communicator of a local world): its
// sends are dropped from now on, so its peers time out waiting for it.
void kill_local_rank(Communicator& comm);

}  // namespace tessera
