#include "train/train_state.h"

#include <cmath>
#include <cstring>
#include <random>

#include "base/check.h"
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
  TS_ASSIGN_OR_RETURN(
      st->runner, StepRunner::create(st->model.graph, plan, backend, comms, adamw_config(opts)));
  TS_RETURN_IF_ERROR(st->runner->add_evaluation(st->eval_model.graph));
  st->rank = comms.world().rank();
  return st;
}

nlohmann::json TrainState::manifest(int64_t completed, const DataLoader& train) const {
  const AdamW& opt = runner->optimizer();
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
  m["plan"] = plan_to_json(runner->program().plan);
  return m;
}

Result<bool> TrainState::params_finite() const {
  auto finite = [](const float* p, int64_t n) {
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) ok &= std::isfinite(p[i]);
    return ok;
  };
  bool ok = true;
  for (size_t i = 0; i < model.graph.params().size() && ok; ++i)
    ok = finite(runner->param_data(i), runner->param_piece(i).count);
  TS_ASSIGN_OR_RETURN(double bad, runner->comms().world().all_reduce_scalar(
                                      ok ? 0.0 : 1.0, /*max=*/true, "parameters finite"));
  return bad == 0;
}

Status TrainState::save(const std::string& root, int64_t completed, const DataLoader& train) const {
  // A distributed run writes each rank's pieces; one process writes plain safetensors files.
  if (distributed()) return save_sharded(root, completed, manifest(completed, train));
  const Graph& g = model.graph;
  AdamW& opt = runner->optimizer();
  NamedTensorRefs params, moments;
  for (size_t i = 0; i < g.params().size(); ++i) {
    ValueId p = g.params()[i];
    const std::string& name = g.name_of(p);
    std::vector<int64_t> shape = g.type(p).shape.dims();
    params.push_back({name, TensorRef{DType::f32, shape, runner->param_data(i)}});
    moments.push_back({"adam.m." + name, TensorRef{DType::f32, shape, opt.m(i).data()}});
    moments.push_back({"adam.v." + name, TensorRef{DType::f32, shape, opt.v(i).data()}});
  }
  CheckpointWriter w(root, checkpoint_name(completed));
  TS_RETURN_IF_ERROR(w.add_tensors("model.safetensors", params));
  TS_RETURN_IF_ERROR(w.add_tensors("optimizer.safetensors", moments));
  TS_RETURN_IF_ERROR(w.commit(manifest(completed, train)));
  if (opts.keep_ckpts > 0)
    TS_RETURN_IF_ERROR(prune_checkpoints(root, static_cast<int>(opts.keep_ckpts)));
  return Status();
}

// Every rank writes the pieces it is the designated writer of (one copy of each element;
// a tensor-parallel piece as its box of the global tensor), all ranks agree that every
// write succeeded, then rank 0 publishes.
Status TrainState::save_sharded(const std::string& root, int64_t completed,
                                const nlohmann::json& man) const {
  StepRunner& d = *runner;
  const Program& prog = d.program();
  const Graph& g = model.graph;
  std::vector<TensorShard> shards;
  for (size_t i = 0; i < g.params().size(); ++i) {
    const ParamLayout& pl = prog.part.params[i];
    const LocalPiece pp = d.param_piece(i), op = d.optim_piece(i);
    const Box box = d.param_box(i);  // this rank's tensor-parallel piece of the global tensor
    if (d.writes_param(i))
      shards.push_back({pl.name, DType::f32, pl.global_shape, pp.offset, pp.count, d.param_data(i),
                        box.lo, box.hi});
    if (d.writes_optim(i)) {
      shards.push_back({"adam.m." + pl.name, DType::f32, pl.global_shape, op.offset, op.count,
                        d.optimizer().m(i).data(), box.lo, box.hi});
      shards.push_back({"adam.v." + pl.name, DType::f32, pl.global_shape, op.offset, op.count,
                        d.optimizer().v(i).data(), box.lo, box.hi});
    }
  }
  Communicator& world = d.comms().world();
  const std::string name = checkpoint_name(completed);
  Status wrote = write_checkpoint_shards(root, name, world.rank(), world.size(), shards);
  TS_ASSIGN_OR_RETURN(double failed,
                      world.all_reduce_scalar(wrote.ok() ? 0.0 : 1.0, true, "checkpoint write"));
  if (!wrote.ok()) return wrote;
  if (failed > 0)
    return error("checkpoint " + name + ": another rank failed to write its shards",
                 "see that rank's message; the previous checkpoint is intact");
  Status committed;
  if (world.rank() == 0) {
    committed = commit_checkpoint_shards(root, name, world.size(), man);
    if (committed.ok() && opts.keep_ckpts > 0)
      committed = prune_checkpoints(root, static_cast<int>(opts.keep_ckpts));
  }
  TS_ASSIGN_OR_RETURN(
      failed, world.all_reduce_scalar(committed.ok() ? 0.0 : 1.0, true, "checkpoint commit"));
  if (!committed.ok()) return committed;
  if (failed > 0) return error("checkpoint " + name + ": rank 0 failed to commit it");
  return Status();
}

Result<int64_t> TrainState::load(const std::string& root, DataLoader* train) {
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
    const Graph& g = model.graph;
    AdamW& opt = runner->optimizer();
    for (size_t i = 0; i < g.params().size(); ++i) {
      ValueId p = g.params()[i];
      const std::string& name = g.name_of(p);
      TS_ASSIGN_OR_RETURN(Shape shape, ck.global_shape(name));
      if (shape != g.type(p).shape)
        return error(where + ": tensor " + name + " has shape " + shape.to_string() +
                     ", expected " + g.type(p).shape.to_string());
      const LocalPiece pp = runner->param_piece(i), op = runner->optim_piece(i);
      const Box box = runner->param_box(i);
      float* dst = runner->param_data(i);
      TS_RETURN_IF_ERROR(ck.read_box(name, box.lo, box.hi, pp.offset, pp.count, dst));
      TS_RETURN_IF_ERROR(
          ck.read_box("adam.m." + name, box.lo, box.hi, op.offset, op.count, opt.m(i).data()));
      TS_RETURN_IF_ERROR(
          ck.read_box("adam.v." + name, box.lo, box.hi, op.offset, op.count, opt.v(i).data()));
    }
    opt.set_steps(m.at("optimizer").at("t").get<int64_t>());
    TS_ASSIGN_OR_RETURN(LoaderState ls, loader_state_from_json(m.at("loader")));
    Status s = train->restore(ls);
    if (!s.ok()) return s.with_context(where);
    return m.at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return error(where + ": manifest.json is missing a field: " + e.what(),
                 "the checkpoint is corrupt or from another version; resume from an earlier one");
  }
}

std::string TrainState::sample(const std::vector<std::vector<float>>& whole,
                               const std::vector<int32_t>& prompt, int tokens, uint64_t seed,
                               const Gpt2Tokenizer& tok) {
  ModelGraph gen = build_model(cfg, 1, opts.seq, ModelMode::logits);
  Executor ex(gen.graph, backend);
  const Graph& g = model.graph;
  for (size_t i = 0; i < g.params().size(); ++i) {
    const ValueId q = gen.graph.find_param(g.name_of(g.params()[i]));
    TS_CHECK_GE(q, 0) << g.name_of(g.params()[i]);
    std::memcpy(ex.raw(q), whole[i].data(), whole[i].size() * sizeof(float));
  }
  std::mt19937_64 rng(seed);
  std::vector<int32_t> out = sample_tokens(ex, gen, prompt, tokens, SampleOptions{}, rng);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), out.begin(), out.end());
  return tok.decode(all);
}

}  // namespace tessera
