// make_step_driver, and the driver of an SPMD plan: its StepRunner, with evaluation under the
// same plan. (A pipeline stage's driver is PipelineRunner itself.)
#include "runtime/step_driver.h"

#include "base/format.h"
#include "parallel/pipeline_program.h"
#include "runtime/pipeline_runner.h"

namespace tessera {
namespace {

class SpmdDriver final : public StepDriver {
 public:
  explicit SpmdDriver(std::unique_ptr<StepRunner> runner) : runner_(std::move(runner)) {}

  const Plan& plan() const override { return runner_->program().plan; }
  MeshComms& comms() const override { return runner_->comms(); }
  int64_t micro_batches_per_call() const override { return 1; }
  void init_params(uint64_t seed) override { runner_->init_params(seed); }
  Result<float> forward_backward(const Feed& feed) override {
    return runner_->forward_backward(feed);
  }
  std::vector<std::pair<std::string, double>> take_metrics() override {
    return runner_->take_metrics();
  }
  Result<double> apply(double lr, double clip) override { return runner_->apply(lr, clip); }
  double loss_scale() const override { return runner_->loss_scale(); }
  int64_t loss_scale_good_steps() const override { return runner_->loss_scale_good_steps(); }
  bool step_skipped() const override { return runner_->step_skipped(); }
  void set_loss_scale(double scale, int64_t good_steps) override {
    runner_->set_loss_scale(scale, good_steps);
  }
  Result<float> evaluate(const Feed& feed) override { return runner_->evaluate(feed); }
  Status gather_params(std::vector<std::vector<float>>* whole) override {
    return runner_->gather_params(whole);
  }
  void paint_arena() override { runner_->executor().paint_arena(); }
  int64_t measured_arena_bytes() const override {
    return runner_->executor().measured_high_water();
  }
  int64_t planned_arena_bytes() const override { return runner_->executor().plan().arena_bytes; }
  std::string describe_memory() const override;
  int64_t planned_bytes() const override {
    const Program& prog = runner_->program();
    const Plan& p = prog.plan;
    return runner_->executor().plan().arena_bytes + prog.param_bytes +
           (p.micro_batches > 1 ? prog.grad_bytes : 0) +
           (p.offloads_optimizer() ? prog.host_bytes : prog.optim_bytes) +
           runner_->eval_executor()->plan().arena_bytes;
  }
  void set_trace(StepTrace* trace) override {
    runner_->set_trace(trace);
    comms().set_trace_sink(trace);
  }
  std::vector<HeldParam> held_params() const override {
    std::vector<HeldParam> out;
    for (size_t i = 0; i < runner_->program().part.params.size(); ++i)
      out.push_back({runner_.get(), i, runner_->writes_param(i), runner_->writes_optim(i)});
    return out;
  }

 private:
  std::unique_ptr<StepRunner> runner_;
};

std::string SpmdDriver::describe_memory() const {
  auto b = [](int64_t n) { return format_bytes(static_cast<double>(n)); };
  const Program& prog = runner_->program();
  const Plan& p = prog.plan;
  // One micro-batch per step: the optimizer reads the gradients in the arena.
  const std::string grads = p.micro_batches > 1 ? b(prog.grad_bytes) : std::string("in the arena");
  // Evaluation runs under the same plan on the same parameters, in an arena of its own.
  const std::string eval_arena = b(runner_->eval_executor()->plan().arena_bytes);
  // Offloaded: the f32 master weights, AdamW's moments and the gradients' f32 copies.
  const std::string optimizer =
      p.offloads_optimizer()
          ? b(prog.host_bytes) + " in host memory, offloaded" +
                (p.offloads_params() ? std::string(" with the parameter blocks") : std::string())
          : b(prog.optim_bytes);
  // Offloaded parameters: none between steps; their gathers' outputs are in the arena.
  const std::string params =
      b(prog.param_bytes) + (p.offloads_params() ? " (gathered from host memory per use)" : "");
  if (comms().world().size() > 1)
    return "plan " + p.describe() + " on " + std::to_string(p.mesh.size()) +
           " ranks: per rank arena " + b(prog.memory.arena_bytes) + ", parameters " + params +
           ", gradients " + grads + ", optimizer " + optimizer + ", evaluation arena " +
           eval_arena + "; " + format_bytes(prog.comm_bytes_per_step) + " sent per step\n";
  const Graph& local = prog.local();
  const bool masters = !local.params().empty() && local.type(local.params()[0]).dtype != DType::f32;
  return "planned memory: arena " + b(runner_->executor().plan().arena_bytes) +
         " (activations, gradients), parameters " + params + ", gradients " + grads +
         ", optimizer " + optimizer +
         (p.offloads_optimizer()
              ? " (AdamW's two moments, the f32 master weights and the gradients' f32 copies)"
          : masters ? " (AdamW's two moments and the f32 master weights)"
                    : " (AdamW's two moments)") +
         ", evaluation arena " + eval_arena + "\n";
}

}  // namespace

Result<std::unique_ptr<StepDriver>> make_step_driver(const Graph& model, const Graph& eval,
                                                     const Plan& plan, Backend& backend,
                                                     MeshComms& comms, AdamWConfig opt) {
  if (plan.stages() > 1) {
    TS_ASSIGN_OR_RETURN(PipelineProgram pp, lower_pipeline(model, plan));
    TS_ASSIGN_OR_RETURN(
        std::unique_ptr<PipelineRunner> stage,
        PipelineRunner::create(model, std::make_unique<PipelineProgram>(std::move(pp)), backend,
                               comms, opt));
    return std::unique_ptr<StepDriver>(std::move(stage));
  }
  TS_ASSIGN_OR_RETURN(std::unique_ptr<StepRunner> runner,
                      StepRunner::create(model, plan, backend, comms, opt));
  TS_RETURN_IF_ERROR(runner->add_evaluation(eval));
  return std::unique_ptr<StepDriver>(new SpmdDriver(std::move(runner)));
}

}  // namespace tessera
