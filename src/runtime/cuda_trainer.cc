#include "runtime/cuda_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/optim.h"
#include "base/check.h"
#include "runtime/executor.h"

namespace tessera {
namespace {
constexpr int64_t kAlign = 256;
int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
}  // namespace

CudaTrainer::CudaTrainer(const Graph& g, CudaBackend& gpu, CudaTrainerOptions options)
    : g_(g), gpu_(gpu), opt_(options), plan_(plan_memory(g)) {
  TS_CHECK_GE(g.loss(), 0) << "CudaTrainer needs a training graph (a loss and gradients)";
  // One persistent block: each parameter, its master copy (low precision only), m, v; then
  // the norm's partial sums (one per optimizer chunk), the clipping coefficient, the norm and
  // the AdamW step's values, and the optimizer's tensor descriptors.
  param_ptr_.assign(g.values().size(), nullptr);
  std::vector<int64_t> offsets;
  int64_t at = 0;
  for (ValueId p : g.params()) {
    const TensorType& t = g.type(p);
    Slot s;
    s.param = p;
    auto it = g.param_grads().find(p);
    TS_CHECK(it != g.param_grads().end()) << "parameter %" << p << " has no gradient";
    s.grad = it->second;
    s.size = t.shape.numel();
    s.decay = t.shape.rank() >= 2;
    slots_.push_back(s);
    const int64_t f32 = aligned(s.size * 4);
    offsets.push_back(at);
    at += aligned(t.bytes()) + (t.dtype == DType::f32 ? 0 : f32) + 2 * f32;
  }
  std::vector<cuda::OptimTensor> tensors(slots_.size());  // sizes now, pointers below
  for (size_t k = 0; k < slots_.size(); ++k) tensors[k].n = slots_[k].size;
  const int64_t parts_at = at;
  at += aligned(cuda::chunks_of(tensors) * 8);
  const int64_t scalars_at = at;
  at += kAlign;
  const int64_t described_at = at;
  at += aligned(cuda::describe_bytes(tensors));
  persistent_bytes_ = at;
  persistent_ = static_cast<uint8_t*>(gpu_.alloc(persistent_bytes_));
  arena_ = static_cast<uint8_t*>(gpu_.alloc(plan_.arena_bytes));
  for (size_t k = 0; k < slots_.size(); ++k) {
    Slot& s = slots_[k];
    const TensorType& t = g.type(s.param);
    uint8_t* p = persistent_ + offsets[k];
    s.data = p;
    p += aligned(t.bytes());
    if (t.dtype == DType::f32) {
      s.master = static_cast<float*>(s.data);
    } else {
      s.master = reinterpret_cast<float*>(p);
      p += aligned(s.size * 4);
    }
    s.m = reinterpret_cast<float*>(p);
    s.v = reinterpret_cast<float*>(p + aligned(s.size * 4));
    param_ptr_[static_cast<size_t>(s.param)] = s.data;
    tensors[k] = {s.data, s.master, value(s.grad),        s.m,    s.v,
                  s.size, t.dtype,  g.type(s.grad).dtype, s.decay};
  }
  optim_ = cuda::describe(tensors, persistent_ + described_at);
  norm_parts_ = reinterpret_cast<double*>(persistent_ + parts_at);
  norm_ = reinterpret_cast<double*>(persistent_ + scalars_at);
  coef_ = reinterpret_cast<float*>(persistent_ + scalars_at + 8);
  step_values_ = reinterpret_cast<cuda::AdamWStep*>(persistent_ + scalars_at + 16);
}

CudaTrainer::~CudaTrainer() {
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  if (graph_exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph_exec_));
  gpu_.free(arena_);
  gpu_.free(persistent_);
}

void CudaTrainer::init_params(uint64_t seed) {
  std::vector<float> f;
  std::vector<char> narrow;
  for (size_t k = 0; k < slots_.size(); ++k) {
    Slot& s = slots_[k];
    const TensorType& t = g_.type(s.param);
    f.resize(static_cast<size_t>(s.size));
    fill_initial_values(g_, k, seed, 0, s.size, f.data());
    gpu_.to_device(s.master, f.data(), s.size * 4);
    if (t.dtype != DType::f32) {
      narrow.resize(static_cast<size_t>(t.bytes()));
      convert_elements(f.data(), DType::f32, narrow.data(), t.dtype, s.size);
      gpu_.to_device(s.data, narrow.data(), t.bytes());
    }
    std::vector<float> zeros(static_cast<size_t>(s.size), 0.0f);
    gpu_.to_device(s.m, zeros.data(), s.size * 4);
    gpu_.to_device(s.v, zeros.data(), s.size * 4);
    gpu_.synchronize();  // the host vectors are reused
  }
  t_ = 0;
}

void* CudaTrainer::value(ValueId v) {
  if (void* p = param_ptr_[static_cast<size_t>(v)]) return p;
  const int64_t off = plan_.offset(v);
  TS_CHECK_GE(off, 0) << "value %" << v << " has no storage";
  return arena_ + off;
}

void CudaTrainer::set_input(const std::string& name, const void* host) {
  ValueId v = g_.find_input(name);
  TS_CHECK_GE(v, 0) << "no input named '" << name << "'";
  gpu_.to_device(value(v), host, g_.type(v).bytes());
}

float CudaTrainer::step(double lr) {
  write_step_values(lr);
  cudaStream_t s = gpu_.stream();
  if (profiling_ || !opt_.cuda_graph) {
    enqueue_step();
  } else if (graph_exec_ != nullptr) {
    TS_CUDA(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph_exec_), s));
  } else if (eager_steps_ == 0) {  // the first step runs as it is: libraries initialize
    enqueue_step();
    ++eager_steps_;
  } else {  // the second is captured once, then replayed
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    TS_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    enqueue_step();
    TS_CUDA(cudaStreamEndCapture(s, &graph));
    TS_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    TS_CUDA(cudaGraphDestroy(graph));
    graph_exec_ = exec;
    TS_CUDA(cudaGraphLaunch(exec, s));
  }
  const TensorType& lt = g_.type(g_.loss());
  std::vector<char> bytes(static_cast<size_t>(lt.bytes()));
  gpu_.to_host(bytes.data(), value(g_.loss()), lt.bytes());
  float loss = 0;
  convert_elements(bytes.data(), lt.dtype, &loss, DType::f32, 1);
  return loss;
}

void CudaTrainer::enqueue_step() {
  std::vector<const void*> in;
  std::vector<void*> out;
  // Profiling records an event on the stream before each node (and after the optimizer) and
  // reads the intervals after the step: each node's device time, with any idle gap while the
  // host enqueued it, without serializing host and device.
  std::vector<const Node*> buckets;  // null: the optimizer
  auto mark = [&](const Node* bucket) {
    if (!profiling_) return;
    if (events_.size() <= buckets.size()) {
      cudaEvent_t e = nullptr;
      TS_CUDA(cudaEventCreate(&e));
      events_.push_back(e);
    }
    TS_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(events_[buckets.size()]), gpu_.stream()));
    buckets.push_back(bucket);
  };
  for (const Node& n : g_.nodes()) {
    if (n.op == OpKind::parameter || n.op == OpKind::input) continue;
    in.clear();
    out.clear();
    for (ValueId v : n.inputs) in.push_back(value(v));
    for (ValueId v : n.outputs) out.push_back(value(v));
    mark(&n);
    gpu_.run(g_, n, in, out);
  }
  mark(nullptr);
  enqueue_update();
  mark(nullptr);
  if (!profiling_) return;
  gpu_.synchronize();
  for (size_t k = 0; k + 1 < buckets.size(); ++k) {
    float ms = 0;
    TS_CUDA(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[k]),
                                 static_cast<cudaEvent_t>(events_[k + 1])));
    const size_t op = buckets[k] ? static_cast<size_t>(buckets[k]->op) : kNumOps;
    op_seconds_[op] += 1e-3 * ms;
    op_nodes_[op]++;
    Timing& kind = kinds_[buckets[k] ? signature(*buckets[k]) : "optimizer"];
    kind.seconds += 1e-3 * ms;
    kind.nodes++;
  }
}

void CudaTrainer::write_step_values(double lr) {
  ++t_;
  const AdamWConfig& c = opt_.adamw;
  cuda::AdamWStep u;
  u.beta1 = static_cast<float>(c.beta1);
  u.beta2 = static_cast<float>(c.beta2);
  u.step_size = static_cast<float>(lr / (1.0 - std::pow(c.beta1, static_cast<double>(t_))));
  u.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(c.beta2, static_cast<double>(t_))));
  u.eps = static_cast<float>(c.eps);
  u.shrink = static_cast<float>(1.0 - lr * c.weight_decay);
  gpu_.to_device(step_values_, &u, sizeof u);  // staged before the call returns
}

void CudaTrainer::enqueue_update() {
  cudaStream_t s = gpu_.stream();
  cuda::sum_squares(optim_, norm_parts_, s);
  cuda::clip_coefficient(norm_parts_, optim_.chunks, opt_.max_grad_norm, coef_, norm_, s);
  cuda::adamw(optim_, step_values_, coef_, s);
}

std::string CudaTrainer::profile() const {
  std::vector<size_t> order;
  double total = 0;
  for (size_t k = 0; k < op_seconds_.size(); ++k)
    if (op_nodes_[k] > 0) order.push_back(k), total += op_seconds_[k];
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return op_seconds_[a] > op_seconds_[b]; });
  std::string r;
  char line[160];
  std::snprintf(line, sizeof line, "%-26s %8s %10s %6s\n", "op", "nodes", "ms", "share");
  r += line;
  for (size_t k : order) {
    const char* name = k == kNumOps ? "optimizer" : op_name(static_cast<OpKind>(k));
    std::snprintf(line, sizeof line, "%-26s %8lld %10.2f %5.1f%%\n", name,
                  static_cast<long long>(op_nodes_[k]), 1e3 * op_seconds_[k],
                  100.0 * op_seconds_[k] / std::max(total, 1e-30));
    r += line;
  }
  std::vector<std::pair<std::string, Timing>> kinds(kinds_.begin(), kinds_.end());
  std::sort(kinds.begin(), kinds.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  r += "largest node kinds (op, operand types):\n";
  for (size_t k = 0; k < std::min<size_t>(kinds.size(), 16); ++k) {
    const Timing& t = kinds[k].second;
    std::snprintf(line, sizeof line, "  %8.2f ms %5lld x %8.1f us  ", 1e3 * t.seconds,
                  static_cast<long long>(t.nodes), 1e6 * t.seconds / static_cast<double>(t.nodes));
    r += line + kinds[k].first + "\n";
  }
  return r;
}

// An op with its operand types (and a matmul's transposes): the nodes that run one kernel.
std::string CudaTrainer::signature(const Node& n) const {
  std::string s = op_name(n.op);
  if (n.op == OpKind::matmul)
    s += std::string(n.attrs.transpose_a ? " Ta" : "") + (n.attrs.transpose_b ? " Tb" : "");
  for (ValueId v : n.inputs) s += " " + g_.type(v).to_string();
  return s;
}

double CudaTrainer::last_grad_norm() {
  double n = 0;
  gpu_.to_host(&n, norm_, 8);
  return n;
}

std::vector<float> CudaTrainer::master(size_t i) {
  std::vector<float> f(static_cast<size_t>(slots_.at(i).size));
  gpu_.to_host(f.data(), slots_[i].master, slots_[i].size * 4);
  return f;
}

}  // namespace tessera
