// The host-memory communicators' collective algorithms (comm/host_comm.cc): the ring of
// comm/ring.cc over point-to-point transfers, or the MPI library's own non-blocking collectives
// (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast), which Open MPI tunes
// per message size and topology. Chosen per process when its world communicator is made
// (mpi_world); the in-process transport of the tests has only the ring. Either way the
// operations run on the communicator's comm thread, time out naming the axis, and give the same
// bits on every rank (MPI reduces the same tree on every rank; the ring sums in a fixed order).
//
//   auto world = mpi_world(&argc, &argv, CollectiveAlgo::mpi);
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace tessera {

// automatic: the faster of the two as bench/collectives_bench.cc measured them on 2 and 4 ranks
// of one machine (docs/measurements.md, "Collectives"): MPI's all_gather at every size, MPI's
// reductions and broadcasts below kMpiReductionBelowBytes (latency-bound: up to 2x faster), the
// ring's above (up to 3x faster at 8 MiB and more).
enum class CollectiveAlgo { ring, mpi, automatic };
constexpr int64_t kMpiReductionBelowBytes = 128 << 10;
// What mpi_world uses unless told.
constexpr CollectiveAlgo kDefaultCollectiveAlgo = CollectiveAlgo::automatic;

// Switches a host communicator's collectives (those issued after the call; split() passes the
// choice on). Every rank of `comm` must switch at the same point of its operations: the two
// algorithms do not match each other. For tests and the collectives benchmark.
class Communicator;
void set_collective_algo(Communicator& comm, CollectiveAlgo algo);

// "ring" / "mpi" / "auto".
const char* collective_algo_name(CollectiveAlgo a);
std::optional<CollectiveAlgo> parse_collective_algo(std::string_view name);

}  // namespace tessera
