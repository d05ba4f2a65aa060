#include "train/train_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "base/check.h"
#include "base/format.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "io/sharded_checkpoint.h"
#include "runtime/sampler.h"

namespace tessera {

namespace {
AdamWConfig adamw_config(const TrainOptions& o) {
  AdamWConfig ac;
  ac.lr = o.lr;
  ac.weight_decay = o.weight_decay;
  return ac;
}
}  // namespace

TrainState::TrainState(const ModelConfig& c, const TrainOptions& o, Backend& b)
    : cfg(c), opts(o), backend(b) {
  model = build_model(cfg, opts.batch, opts.seq, ModelMode::train);
  eval_model = build_model(cfg, opts.batch, opts.seq, ModelMode::loss);
}

Result<std::unique_ptr<TrainState>> TrainState::create(const ModelConfig& cfg,
                                                       const TrainOptions& opts, Backend& backend,
                                                       MeshComms& comms, const Plan& plan) {
  std::unique_ptr<TrainState> st(new TrainState(cfg, opts, backend));
  st->rank = comms.world().rank();
  TS_ASSIGN_OR_RETURN(st->step, make_step_driver(st->model.graph, st->eval_model.graph, plan,
                                                 backend, comms, adamw_config(opts)));
  return st;
}

std::string TrainState::describe_memory() const {
  const int64_t snapshot = snapshot_bytes();
  const std::string checkpoints =
      snapshot > 0 ? "checkpoints: a snapshot of " + format_bytes(static_cast<double>(snapshot)) +
                         " per rank in host memory while one is written (--sync-checkpoints: "
                         "none)\n"
                   : "";
  if (distributed()) return step->describe_memory() + checkpoints;
  const Graph& g = model.graph;
  return "model " + cfg.name + ": " + format_count(g.param_count()) + " parameters, " +
         format_si(g.total_flops() /
                   static_cast<double>(opts.batch * tokens_per_example(cfg, opts.seq))) +
         " FLOPs/token (train)\n" + step->describe_memory() + checkpoints +
         unaligned_vocabulary_note();
}

// On a device in bf16/f16, a table whose rows are not a multiple of 8 puts the LM head's GEMMs
// off the tensor cores' alignment (GPT-2's 50,257: 1.55x the step on an H100).
std::string TrainState::unaligned_vocabulary_note() const {
  const int64_t rows = cfg.vocab_rows();
  if (backend.memory() != MemSpace::device || !is_low_precision(cfg.dtype) || rows % 8 == 0)
    return "";
  const int64_t padded = (rows + 127) / 128 * 128;
  return "note: the token table's " + std::to_string(rows) +
         " rows are not a multiple of 8, so the LM head's GEMMs run at a fraction of the GPU's "
         "rate; padded_vocab_size = " +
         std::to_string(padded) +
         " in a model config trains the same model faster (GPT-2 124M bf16 on an H100: 1.55x)\n";
}

nlohmann::json TrainState::manifest(int64_t completed, const BatchStream& train) const {
  const AdamW& opt = held_params().front().runner->optimizer();
  const AdamWConfig& ac = opt.config();
  nlohmann::json m = {{"step", completed},
                      {"model", model_config_to_json(cfg)},
                      {"optimizer",
                       {{"type", "adamw"},
                        {"t", opt.steps()},
                        {"lr", ac.lr},
                        {"beta1", ac.beta1},
                        {"beta2", ac.beta2},
                        {"eps", ac.eps},
                        {"weight_decay", ac.weight_decay}}},
                      {"loader", train.state()},
                      {"rng", {{"seed", opts.seed}}},
                      {"train",
                       {{"batch", opts.batch},
                        {"seq", opts.seq},
                        {"steps", opts.steps},
                        {"grad_accum", opts.grad_accum},
                        {"lr", opts.lr},
                        {"warmup", opts.warmup},
                        {"min_lr_frac", opts.min_lr_frac},
                        {"clip", opts.clip}}}};
  m["plan"] = plan_to_json(plan());
  if (loss_scale() > 0)  // an fp16 run: where its loss scale is
    m["loss_scale"] = {{"scale", loss_scale()}, {"good_steps", loss_scale_good_steps()}};
  return m;
}

Result<bool> TrainState::params_finite() const {
  auto finite = [](const float* p, int64_t n) {
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) ok &= std::isfinite(p[i]);
    return ok;
  };
  bool ok = true;
  for (const HeldParam& h : held_params()) {
    HostStaging host(h.runner->state_backend());
    const int64_t n = h.runner->param_piece(h.index).count;
    ok = ok && finite(host.read(h.runner->param_storage(h.index), n), n);
  }
  TS_ASSIGN_OR_RETURN(double bad, comms().world().all_reduce_scalar(ok ? 0.0 : 1.0, /*max=*/true,
                                                                    "parameters finite"));
  return bad == 0;
}

Result<int64_t> TrainState::load(const std::string& root, BatchStream* train) {
  TS_ASSIGN_OR_RETURN(ShardedCheckpoint ck, ShardedCheckpoint::open(root));
  const nlohmann::json& m = ck.manifest();
  std::string where = "checkpoint " + ck.dir();
  try {
    TS_ASSIGN_OR_RETURN(ModelConfig saved, model_config_from_json(m.at("model")));
    const nlohmann::json have = model_config_to_json(saved), want = model_config_to_json(cfg);
    if (have != want) {
      std::string diff;
      for (auto it = want.begin(); it != want.end(); ++it) {
        if (it.key() == "name" || (have.contains(it.key()) && have.at(it.key()) == it.value()))
          continue;
        diff += (diff.empty() ? "" : ", ") + it.key() + " " +
                (have.contains(it.key()) ? have.at(it.key()).dump() : std::string("(none)")) +
                " there, " + it.value().dump() + " here";
      }
      if (diff.empty()) diff = "the model name";
      return error(
          where + " was written by another model (" + have.value("name", "?") + "): " + diff,
          "pass the same --model as the run that wrote it, or another --out");
    }
    const nlohmann::json& t = m.at("train");
    if (t.at("batch").get<int64_t>() != opts.batch || t.at("seq").get<int64_t>() != opts.seq ||
        t.at("grad_accum").get<int64_t>() != opts.grad_accum)
      return error(where + " was written with --batch " + t.at("batch").dump() + " --seq " +
                       t.at("seq").dump() + " --grad-accum " + t.at("grad_accum").dump(),
                   "resume with the same (global) batch shape; the plan may differ");
    resume_changes.clear();
    auto changed = [&](const char* key, const char* flag, double now) {
      if (t.contains(key) && t.at(key).get<double>() != now)
        resume_changes.push_back(std::string(flag) + " " + number_text(now) + " (was " +
                                 number_text(t.at(key).get<double>()) + ")");
    };
    changed("lr", "--lr", opts.lr);
    changed("warmup", "--warmup", static_cast<double>(opts.warmup));
    changed("min_lr_frac", "--min-lr-frac", opts.min_lr_frac);
    changed("clip", "--clip", opts.clip);
    changed("steps", "--steps", static_cast<double>(opts.steps));
    // A hand-edited manifest: the steps taken, and the optimizer's count of them, in range.
    const int64_t step = m.at("step").get<int64_t>();
    const int64_t adam_steps = m.at("optimizer").at("t").get<int64_t>();
    if (step < 0 || adam_steps < 0 || adam_steps > step)
      return error(where + "/manifest.json: step " + std::to_string(step) + " and optimizer.t " +
                       std::to_string(adam_steps) +
                       " are not a training state (0 <= optimizer.t <= step)",
                   "the manifest was edited or damaged; resume from an earlier checkpoint");
    TS_RETURN_IF_ERROR(read_held(ck, /*with_moments=*/true));
    for (const HeldParam& h : held_params()) h.runner->optimizer().set_steps(adam_steps);
    // An fp16 run resumed in fp16 goes on from its scale (other precisions scale nothing).
    if (m.contains("loss_scale") && loss_scale() > 0)
      set_loss_scale(m.at("loss_scale").at("scale").get<double>(),
                     m.at("loss_scale").at("good_steps").get<int64_t>());
    TS_ASSIGN_OR_RETURN(LoaderState ls, loader_state_from_json(m.at("loader")));
    Status s = train->restore(ls);
    if (!s.ok()) return s.with_context(where);
    return step;
  } catch (const nlohmann::json::exception& e) {
    return error(where + ": manifest.json is missing a field: " + e.what(),
                 "the checkpoint is corrupt or from another version; resume from an earlier one");
  }
}

// This rank's pieces of every parameter it holds (and their AdamW moments) from a checkpoint
// written under any plan.
Status TrainState::read_held(const ShardedCheckpoint& ck, bool with_moments) {
  const std::string where = "checkpoint " + ck.dir();
  for (const HeldParam& h : held_params()) {
    StepRunner& r = *h.runner;
    const size_t i = h.index;
    const ParamLayout& pl = r.program().part.params[i];
    const std::string& name = pl.name;
    TS_ASSIGN_OR_RETURN(Shape shape, ck.global_shape(name));
    if (shape != pl.global_shape)
      return error(where + ": tensor " + name + " has shape " + shape.to_string() + ", expected " +
                   pl.global_shape.to_string());
    const LocalPiece pp = r.param_piece(i), op = r.optim_piece(i);
    const Box box = r.param_box(i);
    HostStaging host(r.state_backend());  // device state: read into host copies, then copied in
    TS_RETURN_IF_ERROR(ck.read_box(name, box.lo, box.hi, pp.offset, pp.count,
                                   host.write(r.param_storage(i), pp.count)));
    if (with_moments) {
      AdamW& opt = r.optimizer();
      TS_RETURN_IF_ERROR(ck.read_box("adam.m." + name, box.lo, box.hi, op.offset, op.count,
                                     host.write(opt.m(i), op.count)));
      TS_RETURN_IF_ERROR(ck.read_box("adam.v." + name, box.lo, box.hi, op.offset, op.count,
                                     host.write(opt.v(i), op.count)));
    }
    host.flush();
  }
  // The working copies of the f32 weights just read (bf16 runs; with the optimizer offloaded,
  // the device's copy of every parameter): once per runner, after all of its pieces.
  std::vector<StepRunner*> runners;
  for (const HeldParam& h : held_params())
    if (std::find(runners.begin(), runners.end(), h.runner) == runners.end())
      runners.push_back(h.runner);
  for (StepRunner* r : runners) r->refresh_working_params();
  return Status();
}

Status TrainState::init_params_from(const std::string& checkpoint) {
  TS_ASSIGN_OR_RETURN(ShardedCheckpoint ck, ShardedCheckpoint::open(checkpoint));
  return read_held(ck, /*with_moments=*/false);
}

Feed feed_of(const HostBatch& batch) {
  Feed f;
  for (const auto& [name, bytes] : batch.inputs) f.set(name, bytes.data());
  return f;
}

namespace {

// The model in f32: accuracy and samples read the gathered f32 (master) weights.
ModelConfig in_f32(ModelConfig c) {
  c.dtype = DType::f32;
  return c;
}

// An executor of `gen` holding the whole parameters of `model` (the same names).
void load_whole(Executor& ex, const ModelGraph& gen, const Graph& model,
                const std::vector<std::vector<float>>& whole) {
  for (size_t i = 0; i < model.params().size(); ++i) {
    const ValueId q = gen.graph.find_param(model.name_of(model.params()[i]));
    TS_CHECK_GE(q, 0) << model.name_of(model.params()[i]);
    ex.backend().to_device(ex.raw(q), whole[i].data(),
                           static_cast<int64_t>(whole[i].size() * sizeof(float)));
  }
}

}  // namespace

double TrainState::accuracy(const std::vector<std::vector<float>>& whole, BatchStream& stream,
                            int64_t batches) {
  ModelGraph gen = build_model(in_f32(cfg), opts.batch, opts.seq, ModelMode::logits);
  Executor ex(gen.graph, backend);
  load_whole(ex, gen, model.graph, whole);
  std::string labels_name;  // the training graph's target input
  for (const ModelInput& in : model.inputs)
    if (in.target) labels_name = in.name;
  int64_t right = 0, seen = 0;
  HostBatch batch;
  std::vector<float> logits_host(static_cast<size_t>(gen.graph.type(gen.logits).shape.numel()));
  for (int64_t b = 0; b < batches; ++b) {
    batch.clear();
    stream.next(&batch);
    Status s = feed_of(batch).bind(ex);
    TS_CHECK(s.ok()) << s.to_string();
    ex.run();
    ex.read(gen.logits, logits_host.data());
    const float* logits = logits_host.data();
    const auto* labels = reinterpret_cast<const int32_t*>(batch.buffer(labels_name).data());
    const Shape& ls = gen.graph.type(gen.logits).shape;  // [..., classes + padding]
    const int64_t stride = ls[-1], rows = ls.numel() / stride, cols = gen.classes;
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = logits + r * stride;
      right += std::max_element(row, row + cols) - row == labels[r];
    }
    seen += rows;
  }
  return seen > 0 ? static_cast<double>(right) / static_cast<double>(seen) : 0.0;
}

Result<std::string> TrainState::sample(const std::vector<std::vector<float>>& whole,
                                       const std::vector<int32_t>& prompt, int tokens,
                                       uint64_t seed, const Tokenizer& tok) {
  ModelGraph gen = build_model(in_f32(cfg), 1, opts.seq, ModelMode::logits);
  Executor ex(gen.graph, backend);
  load_whole(ex, gen, model.graph, whole);
  std::mt19937_64 rng(seed);
  TS_ASSIGN_OR_RETURN(std::vector<int32_t> out,
                      sample_tokens(ex, gen, prompt, tokens, SampleOptions{}, rng));
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), out.begin(), out.end());
  return tok.decode(all);
}

}  // namespace tessera
