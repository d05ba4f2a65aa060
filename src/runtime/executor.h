// Executes a Graph on a Backend: parameters live in persistent storage, every other value at
// its offset in one arena sized by the static memory plan (parallel/memory_plan.h).
//
//   Executor ex(model.graph, cpu);
//   ex.init_params(seed);
//   ex.set_input("tokens", tokens.data());
//   ex.run();
//   float loss = ex.read_scalar(model.loss);
//
// Its memory comes from the backend (Backend::allocate): host memory on the CPU backend,
// device memory on CUDA, none on the NULL backend (planning tests run it on full-size models).
//
// The arena high-water mark can be measured by painting it before a run and scanning after:
//   ex.paint_arena(); ...set inputs...; ex.run(); ex.measured_high_water() == plan.arena_bytes
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "parallel/memory_plan.h"

namespace tessera {

// The initial value of element `element` (row-major in the global tensor) of parameter
// `param` = g.params()[param]: a function of (seed, param, element) alone (a counter-based
// normal draw, Box-Muller on two hashed uniforms), so a rank computes just its own piece and
// any number of ranks starts from the same model.
float initial_value(const Graph& g, size_t param, uint64_t seed, int64_t element);
// Fills dst[k] = initial_value(g, param, seed, first + k) for k < count.
void fill_initial_values(const Graph& g, size_t param, uint64_t seed, int64_t first, int64_t count,
                         float* dst);

// Arena storage that several executors use in turn (the phases of a pipeline stage, which
// never run at once): one buffer of the backend, at least each sharer's planned arena.
// paint()/high_water() measure the most any of them used, as Executor's do for one (on a
// device backend high_water() copies the arena to the host to scan it; on the NULL backend,
// which writes nothing, it is 0).
struct SharedArena {
  std::shared_ptr<Buffer> buffer;
  int64_t bytes = 0;
  static SharedArena make(Backend& backend, int64_t bytes);
  uint8_t* data() const { return buffer->bytes_at(0); }
  void paint();
  int64_t high_water() const;
};

class Executor {
 public:
  Executor(const Graph& g, Backend& backend);
  // Reads (and writes) the parameters of `params_of` in place: each parameter of g is the
  // same-named one there, of the same type (an evaluation graph beside a training graph). No
  // parameter storage of its own; params_of must outlive this executor.
  Executor(const Graph& g, Backend& backend, Executor& params_of);
  // Runs in `arena` (which must hold g's planned arena) instead of one of its own, with the
  // parameters of params_of (null: its own).
  Executor(const Graph& g, Backend& backend, Executor* params_of, SharedArena arena);
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  const Graph& graph() const { return g_; }
  const MemoryPlan& plan() const { return plan_; }
  Backend& backend() const { return backend_; }

  // Initializes every parameter from its recorded Init (normal with a seeded generator).
  void init_params(uint64_t seed);
  // Copies `bytes` (the value's full size) into the named input's arena slot.
  void set_input(const std::string& name, const void* data);
  // Runs every node in order.
  void run();
  // Runs one node on the backend (StepRunner drives a Program's nodes one by one).
  void run_node(const Node& n);

  // Storage of any value in the backend's memory: persistent for parameters, the arena slot
  // otherwise (valid until the next run overwrites it).
  void* raw(ValueId v);
  // The same as a host pointer, for code that reads values in place: host backends only
  // (read() copies a value out of any backend).
  template <typename T>
  T* data(ValueId v) {
    check_host();
    return static_cast<T*>(raw(v));
  }
  // Copies value v's bytes to host memory (waits for the backend's work before it).
  void read(ValueId v, void* host_dst);
  // An f32 scalar (the loss), read from any backend.
  float read_scalar(ValueId v);

  // Arena high-water measurement (see the header comment).
  void paint_arena();
  int64_t measured_high_water() const;

 private:
  const Graph& g_;
  Backend& backend_;
  MemoryPlan plan_;
  std::vector<uint8_t*> param_ptr_;  // indexed by ValueId, null for non-parameters
  Buffer params_;
  void own_params();
  void share_params(Executor& params_of);
  void check_host() const;
  SharedArena arena_;
  std::vector<const void*> in_;  // run_node's operand pointers, reused
  std::vector<void*> out_;
};

}  // namespace tessera
