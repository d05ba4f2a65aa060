// A rank's state in host memory (Plan::offload; runtime/step_runner.h): the gradients' copies
// to the host, the updated pieces back to the device, the host-held ZeRO-3 blocks fetched into
// their gathers, and the working copies refreshed from the f32 masters.
#include "backend/cpu/cpu_backend.h"
#include "runtime/step_runner.h"

namespace tessera {

void StepRunner::grad_to_host(size_t i) {
  const DeviceGrad& g = device_grads_[i];
  void* dst = host_grads_[i].data();
  const int64_t bytes = g.count * static_cast<int64_t>(dtype_size(g.dtype));
  if (g.dtype == DType::f32) {
    exec_->backend().to_host(dst, g.data, bytes);
    return;
  }
  staging_.resize(static_cast<size_t>(bytes));
  exec_->backend().to_host(staging_.data(), g.data, bytes);
  host_->convert(staging_.data(), g.dtype, dst, DType::f32, g.count);
}

void StepRunner::param_to_device(size_t i, std::vector<uint8_t>& staging) {
  const ValueId v = param_value(i);
  const DType dt = exec_->graph().type(v).dtype;
  const int64_t n = param_piece(i).count;
  const void* src = masters_[i].data();
  if (dt != DType::f32) {  // (one thread: the host backend's pool may be running AdamW)
    staging.resize(static_cast<size_t>(n) * dtype_size(dt));
    convert_elements(src, DType::f32, staging.data(), dt, n);
    src = staging.data();
  }
  exec_->backend().to_device(exec_->raw(v), src, n * static_cast<int64_t>(dtype_size(dt)));
}

void* StepRunner::gather_slot(const Node& gather, Executor& ex) {
  const Communicator& c = comms_.group(gather.attr<GroupAttrs>().axes, ex.backend().memory());
  return static_cast<uint8_t*>(ex.raw(gather.outputs[0])) +
         c.rank() * ex.graph().type(gather.inputs[0]).bytes();
}

void StepRunner::fetch_param(const Node& gather, Executor& ex) {
  const Graph& g = ex.graph();
  const ValueId v = gather.inputs[0];
  const size_t i = param_index_.at(g.name_of(v));
  const void* src = host_params_[i] ? host_params_[i].data() : masters_[i].data();
  ex.backend().to_device(gather_slot(gather, ex), src, g.type(v).bytes());
}

void StepRunner::refresh_working_params(bool all) {
  if (host_) {  // the device holds a copy of every parameter; the steps' copies refresh it
    for (size_t i = 0; all && i < masters_.size(); ++i) {
      if (!prog_.part.params[i].params_on_host) {
        param_to_device(i, staging_);
      } else if (host_params_[i]) {  // (an f32 block is its master)
        host_->convert(masters_[i].data(), DType::f32, host_params_[i].data(),
                       exec_->graph().type(param_value(i)).dtype,
                       masters_[i].bytes() / static_cast<int64_t>(sizeof(float)));
      }
    }
    return;
  }
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (!masters_[i] || (!all && opt_->params()[i].working != nullptr)) continue;
    const ValueId v = param_value(i);
    exec_->backend().convert(masters_[i].data(), DType::f32, exec_->raw(v),
                             exec_->graph().type(v).dtype,
                             masters_[i].bytes() / static_cast<int64_t>(sizeof(float)));
  }
}

}  // namespace tessera
