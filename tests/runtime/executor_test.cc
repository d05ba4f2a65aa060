// Initial parameter values (runtime/executor.h): a function of (seed, parameter, element), so
// any piece computed alone equals the same elements of the whole tensor, and the draws are
// normal with the parameter's init_std.
#include "runtime/executor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/null_backend.h"
#include "models/model.h"

namespace tessera {
namespace {

TEST(InitialValues, APieceIsTheSameElementsOfTheWholeTensor) {
  ModelGraph m = build_model(*find_preset("gpt-tiny"), 1, 8, ModelMode::train);
  const Graph& g = m.graph;
  size_t wte = 0;
  for (size_t i = 0; i < g.params().size(); ++i)
    if (g.name_of(g.params()[i]) == "wte") wte = i;
  const int64_t n = g.type(g.params()[wte]).shape.numel();
  std::vector<float> whole(static_cast<size_t>(n));
  fill_initial_values(g, wte, 7, 0, n, whole.data());
  // Pieces starting on odd and even elements (each normal pair spans two elements).
  for (int64_t first : {0L, 1L, 12345L, n - 3}) {
    for (int64_t count : {1L, 2L, 3L}) {
      std::vector<float> piece(static_cast<size_t>(count));
      fill_initial_values(g, wte, 7, first, count, piece.data());
      for (int64_t k = 0; k < count; ++k)
        EXPECT_EQ(piece[static_cast<size_t>(k)], whole[static_cast<size_t>(first + k)])
            << first << "+" << k;
    }
    EXPECT_EQ(initial_value(g, wte, 7, first), whole[static_cast<size_t>(first)]);
  }
  // Normal with the model's init_std: mean and standard deviation over 3.2 M draws.
  double sum = 0, sq = 0;
  for (float x : whole) {
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  const double mean = sum / static_cast<double>(n), sd = std::sqrt(sq / static_cast<double>(n));
  EXPECT_LT(std::fabs(mean), 5 * 0.02 / std::sqrt(static_cast<double>(n)));
  EXPECT_NEAR(sd, 0.02, 0.02 * 0.005);
  // Another seed, another parameter: other values.
  std::vector<float> other(16);
  fill_initial_values(g, wte, 8, 0, 16, other.data());
  EXPECT_NE(other[0], whole[0]);
}

// The executor's memory is the backend's: on the NULL backend a 1.5 B-parameter training graph
// costs no memory and no time, and the executor asks for exactly its memory plan (parameters
// + arena) and runs every node that is a kernel.
TEST(Executor, OnTheNullBackendAllocatesItsPlanAndRunsEveryKernel) {
  ModelGraph m = build_model(*find_preset("gpt2-xl"), 2, 1024, ModelMode::train);
  NullBackend null;
  {
    Executor ex(m.graph, null);
    int64_t aligned_params = 0;
    for (ValueId p : m.graph.params()) aligned_params += (m.graph.type(p).bytes() + 63) / 64 * 64;
    EXPECT_GT(aligned_params, int64_t{6} * 1000 * 1000 * 1000);  // 1.56 B f32 parameters
    EXPECT_EQ(aligned_params, ex.plan().param_bytes);
    EXPECT_EQ(null.bytes_in_use(), aligned_params + ex.plan().arena_bytes);
    EXPECT_EQ(null.buffers_in_use(), 2);  // one block of parameters, one arena

    std::vector<int32_t> tokens(2 * 1024, 1);
    ex.set_input("tokens", tokens.data());
    ex.set_input("targets", tokens.data());
    ex.run();
    int64_t kernels = 0;
    for (const Node& n : m.graph.nodes())
      kernels += n.op != OpKind::parameter && n.op != OpKind::input;
    EXPECT_EQ(null.nodes_run(), kernels);
    EXPECT_EQ(ex.read_scalar(m.loss), 0.0f);  // nothing ran: zeros come back
    ex.paint_arena();
    EXPECT_EQ(ex.measured_high_water(), 0);
  }
  EXPECT_EQ(null.bytes_in_use(), 0);
}

// On the CPU backend the same calls move real bytes: an input set is read back, the loss is
// the value in the arena.
TEST(Executor, ReadsValuesThroughTheBackend) {
  ModelGraph m = build_model(*find_preset("gpt-tiny"), 2, 8, ModelMode::train);
  CpuBackend cpu;
  Executor ex(m.graph, cpu);
  ex.init_params(1);
  std::vector<int32_t> tokens(16), back(16, -1);
  for (int i = 0; i < 16; ++i) tokens[static_cast<size_t>(i)] = (i * 7) % 50;
  ex.set_input("tokens", tokens.data());
  ex.set_input("targets", tokens.data());
  ex.read(m.graph.find_input("tokens"), back.data());
  EXPECT_EQ(back, tokens);
  ex.run();
  EXPECT_EQ(ex.read_scalar(m.loss), *ex.data<float>(m.loss));
  EXPECT_GT(ex.read_scalar(m.loss), 1.0f);  // about ln(vocab) at initialization
}

}  // namespace
}  // namespace tessera
