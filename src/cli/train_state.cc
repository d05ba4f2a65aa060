#include "cli/train_state.h"

#include <cstring>
#include <random>

#include "base/check.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "runtime/sampler.h"

namespace tessera {

TrainState::TrainState(const ModelConfig& c, const TrainOptions& o, Backend& b)
    : cfg(c), opts(o), backend(b) {
  model = build_model(cfg, opts.batch, opts.seq, ModelMode::train);
  AdamWConfig ac;
  ac.lr = opts.lr;
  ac.weight_decay = opts.weight_decay;
  step = std::make_unique<TrainStep>(model, backend, ac);
  eval_model = build_model(cfg, opts.batch, opts.seq, ModelMode::loss);
  eval_exec = std::make_unique<Executor>(eval_model.graph, backend);
}

void copy_params(const Graph& gs, Executor& src, const Graph& gd, Executor& dst) {
  for (ValueId p : gd.params()) {
    ValueId q = gs.find_param(gd.name_of(p));
    TS_CHECK_GE(q, 0) << gd.name_of(p);
    std::memcpy(dst.raw(p), src.raw(q), static_cast<size_t>(gd.type(p).bytes()));
  }
}

void TrainState::copy_params_to_eval() {
  copy_params(model.graph, step->executor(), eval_model.graph, *eval_exec);
}

Status TrainState::save(const std::string& root, int64_t completed, const DataLoader& train) const {
  const Graph& g = model.graph;
  Executor& ex = step->executor();
  AdamW& opt = step->optimizer();
  NamedTensorRefs params, moments;
  for (size_t i = 0; i < g.params().size(); ++i) {
    ValueId p = g.params()[i];
    const std::string& name = g.name_of(p);
    std::vector<int64_t> shape = g.type(p).shape.dims();
    params.push_back({name, TensorRef{DType::f32, shape, ex.raw(p)}});
    moments.push_back({"adam.m." + name, TensorRef{DType::f32, shape, opt.m(i).data()}});
    moments.push_back({"adam.v." + name, TensorRef{DType::f32, shape, opt.v(i).data()}});
  }
  CheckpointWriter w(root, checkpoint_name(completed));
  TS_RETURN_IF_ERROR(w.add_tensors("model.safetensors", params));
  TS_RETURN_IF_ERROR(w.add_tensors("optimizer.safetensors", moments));
  const AdamWConfig& ac = opt.config();
  nlohmann::json manifest = {{"step", completed},
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
  TS_RETURN_IF_ERROR(w.commit(manifest));
  if (opts.keep_ckpts > 0)
    TS_RETURN_IF_ERROR(prune_checkpoints(root, static_cast<int>(opts.keep_ckpts)));
  return Status();
}

Result<int64_t> TrainState::load(const std::string& root, DataLoader* train) {
  TS_ASSIGN_OR_RETURN(Checkpoint ck, load_checkpoint(root));
  const nlohmann::json& m = ck.manifest();
  std::string where = "checkpoint " + ck.dir();
  try {
    TS_ASSIGN_OR_RETURN(ModelConfig saved, model_config_from_json(m.at("model")));
    if (model_config_to_json(saved) != model_config_to_json(cfg))
      return error(where + " holds model " + model_config_to_json(saved).dump() +
                       ", not the requested " + model_config_to_json(cfg).dump(),
                   "pass the same --model as the run that wrote it, or another --out");
    const nlohmann::json& t = m.at("train");
    if (t.at("batch").get<int64_t>() != opts.batch || t.at("seq").get<int64_t>() != opts.seq ||
        t.at("grad_accum").get<int64_t>() != opts.grad_accum)
      return error(where + " was written with --batch " + t.at("batch").dump() + " --seq " +
                       t.at("seq").dump() + " --grad-accum " + t.at("grad_accum").dump(),
                   "resume with the same batch shape");
    const Graph& g = model.graph;
    AdamW& opt = step->optimizer();
    for (size_t i = 0; i < g.params().size(); ++i) {
      ValueId p = g.params()[i];
      const std::string& name = g.name_of(p);
      int64_t bytes = g.type(p).bytes();
      struct Slot {
        std::string key;
        void* dst;
      };
      for (const Slot& s :
           {Slot{name, step->executor().raw(p)}, Slot{"adam.m." + name, opt.m(i).data()},
            Slot{"adam.v." + name, opt.v(i).data()}}) {
        TS_ASSIGN_OR_RETURN(const TensorData* td, ck.find(s.key));
        if (td->dtype != DType::f32 || td->shape != g.type(p).shape.dims() ||
            static_cast<int64_t>(td->bytes.size()) != bytes)
          return error(where + ": tensor " + s.key + " has shape " + shape_to_string(td->shape) +
                       ", expected " + g.type(p).shape.to_string());
        std::memcpy(s.dst, td->bytes.data(), static_cast<size_t>(bytes));
      }
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

std::string TrainState::sample(const std::vector<int32_t>& prompt, int tokens, uint64_t seed,
                               const Gpt2Tokenizer& tok) {
  ModelGraph gen = build_model(cfg, 1, opts.seq, ModelMode::logits);
  Executor ex(gen.graph, backend);
  copy_params(model.graph, step->executor(), gen.graph, ex);
  std::mt19937_64 rng(seed);
  std::vector<int32_t> out = sample_tokens(ex, gen, prompt, tokens, SampleOptions{}, rng);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), out.begin(), out.end());
  return tok.decode(all);
}

}  // namespace tessera
