// Initial parameter values (runtime/executor.h): a function of (seed, parameter, element), so
// any piece computed alone equals the same elements of the whole tensor, and the draws are
// normal with the parameter's init_std.
#include "runtime/executor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

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

}  // namespace
}  // namespace tessera
