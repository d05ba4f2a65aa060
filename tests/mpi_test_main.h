// main() of a GoogleTest executable run under mpirun (CTest label `mpi`): initializes MPI,
// installs the dead-rank reporter, hands the world communicator to the tests, runs them.
//
//   tessera::Communicator* g_world = nullptr;
//   int main(int argc, char** argv) {
//     return tessera::run_mpi_tests(argc, argv, &g_world, [&](tessera::Communicator& w) {
//       return 0;  // or: read argv (after MPI and gtest took theirs), 2 on bad arguments
//     });
//   }
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>

#include "comm/mpi_comm.h"

namespace tessera {

inline int run_mpi_tests(int argc, char** argv, Communicator** world,
                         const std::function<int(Communicator&, int, char**)>& setup = nullptr) {
  testing::InitGoogleTest(&argc, argv);
  auto w = mpi_world(&argc, &argv);
  if (!w.ok()) {
    std::fprintf(stderr, "%s\n", w.status().to_string().c_str());
    return 1;
  }
  install_termination_reporter();
  if (setup)
    if (int rc = setup(*w.value(), argc, argv); rc != 0) return rc;
  *world = w.value().get();
  int rc = RUN_ALL_TESTS();
  *world = nullptr;
  return rc;
}

}  // namespace tessera
