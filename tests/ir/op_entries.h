// The op-consistency table's entries (op_consistency_test.cc holds the harness and the
// forward entries; op_entries_grad.cc the gradient entries, op_entries_attention.cc the
// attention entries).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "op_test_util.h"

namespace tessera::op_test {

enum class Check { forward, grad, source };

struct Entry {
  std::string op;
  Check check;
  std::string label;  // unique, a valid test-name suffix
  std::function<void(Net&)> forward;
  std::function<Var(Net&)> grad;
  double eps = 1e-2, rtol = 1e-2;
};

// Appends a gradient entry for every op with a VJP (op_entries_grad.cc).
void add_gradient_entries(std::vector<Entry>* e);

// Appends the forward entries of attention and position_buckets (op_entries_attention.cc).
void add_attention_entries(std::vector<Entry>* e);

// Appends the entries of the mixture-of-experts routing ops (op_entries_moe.cc).
void add_moe_entries(std::vector<Entry>* e);

// Appends the entries of the fused GEMM epilogues (op_entries_fused.cc).
void add_fused_entries(std::vector<Entry>* e);

}  // namespace tessera::op_test
