// Trains a graph on one GPU through the CUDA backend (-DTESSERA_CUDA=ON). Parameters (in the
// graph's dtype), f32 master weights and AdamW moments live in device memory; every other
// value lives at its offset in one device arena sized by the static memory plan, so a step
// allocates nothing. A step enqueues every node in order on the backend's stream, then the
// global gradient norm, the clipping coefficient and a fused AdamW (backend/cuda/optim.h), all
// on the device; it waits once, to read the loss. From the third step on, a step is one CUDA
// graph launch (CudaTrainerOptions::cuda_graph).
//
//   CudaBackend gpu;
//   CudaTrainer t(model.graph, gpu, {.adamw = {.lr = 6e-4}, .max_grad_norm = 1.0});
//   t.init_params(seed);                       // the values Executor::init_params gives
//   t.set_input("tokens", tokens.data());  t.set_input("targets", targets.data());
//   float loss = t.step(lr);
//
// A bf16 or f16 graph (ModelConfig::dtype) trains in mixed precision: its parameters,
// activations and gradients in that dtype, the master weights and moments in f32.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/optim.h"
#include "ir/graph.h"
#include "parallel/memory_plan.h"
#include "runtime/optimizer.h"

namespace tessera {

struct CudaTrainerOptions {
  AdamWConfig adamw;
  double max_grad_norm = 1.0;  // <= 0: no clipping
  // Replay the step as a CUDA graph: the second step is captured (nodes, norm, clipping and
  // AdamW, whose learning-rate values are read from device memory) and every later one is
  // one launch, so no host time goes into launching a step's ~1,000 kernels. The graph holds
  // the arena's addresses; shapes are the graph's, static.
  bool cuda_graph = true;
};

class CudaTrainer {
 public:
  // g must be a training graph (a loss and parameter gradients).
  CudaTrainer(const Graph& g, CudaBackend& gpu, CudaTrainerOptions options = {});
  ~CudaTrainer();
  CudaTrainer(const CudaTrainer&) = delete;
  CudaTrainer& operator=(const CudaTrainer&) = delete;

  void init_params(uint64_t seed);
  // Copies the named input's full value from host memory (enqueued; the host buffer may be
  // reused once step() returns).
  void set_input(const std::string& name, const void* host);
  // Forward, backward, clipping and one AdamW step at learning rate lr; returns the loss.
  float step(double lr);
  // The gradient norm before clipping of the last step (waits for the device).
  double last_grad_norm();
  // Parameter i (g.params()[i]) as f32: its master weights.
  std::vector<float> master(size_t i);

  // Profiling: with it on, step() times every node on the device (CUDA events between the
  // nodes, read after the step) and adds it to its op's total; profile() prints the totals,
  // largest first, with the optimizer's device passes as "optimizer", then the largest node
  // kinds (an op on given operand types).
  void set_profiling(bool on) { profiling_ = on; }
  std::string profile() const;

  const MemoryPlan& plan() const { return plan_; }
  // Device bytes outside the arena: parameters, master weights, moments, norm scratch.
  int64_t persistent_bytes() const { return persistent_bytes_; }

 private:
  void* value(ValueId v);
  void write_step_values(double lr);  // AdamW's values of this step, copied to the device
  void enqueue_step();                // every node, then enqueue_update()
  void enqueue_update();              // the gradient norm, clipping and AdamW

  const Graph& g_;
  CudaBackend& gpu_;
  CudaTrainerOptions opt_;
  MemoryPlan plan_;
  uint8_t* arena_ = nullptr;
  uint8_t* persistent_ = nullptr;
  int64_t persistent_bytes_ = 0;
  struct Slot {
    ValueId param = -1, grad = -1;
    int64_t size = 0;
    bool decay = true;
    void* data = nullptr;     // in the graph's dtype
    float* master = nullptr;  // == data for f32 parameters
    float *m = nullptr, *v = nullptr;
  };
  std::vector<Slot> slots_;
  std::vector<void*> param_ptr_;  // by ValueId; null for arena values
  double* norm_parts_ = nullptr;
  float* coef_ = nullptr;
  double* norm_ = nullptr;
  cuda::AdamWStep* step_values_ = nullptr;
  cuda::OptimTensors optim_;    // every parameter, for the one-launch optimizer passes
  void* graph_exec_ = nullptr;  // cudaGraphExec_t of the captured step
  int eager_steps_ = 0;
  int64_t t_ = 0;
  bool profiling_ = false;
  std::vector<void*> events_;  // cudaEvent_t, one per node boundary
  std::vector<double> op_seconds_ = std::vector<double>(kNumOps + 1, 0.0);  // + optimizer
  std::vector<int64_t> op_nodes_ = std::vector<int64_t>(kNumOps + 1, 0);
  struct Timing {
    double seconds = 0;
    int64_t nodes = 0;
  };
  std::map<std::string, Timing> kinds_;  // by signature()
  std::string signature(const Node& n) const;
};

}  // namespace tessera
