// `tessera train`: its flags, and the one place that turns them into a TrainJob (the model,
// the plan with its placements, this process's MPI world) for the training loop
// (train/trainer.h).
#include <cstdio>
#include <cstdlib>

#include "base/check.h"
#include "base/format.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/plan_flags.h"
#include "cost/cluster_spec.h"
#include "io/model_config.h"
#include "io/sharded_checkpoint.h"
#include "parallel/pipeline_program.h"
#include "parallel/plan.h"
#include "planner/explain.h"
#include "planner/planner.h"
#include "train/trainer.h"

namespace tessera {

namespace {

// The plan flags of the run (one process: a plan of one rank).
PlanFlags plan_flags(const TrainOptions& o) {
  return PlanFlags{o.plan,
                   o.dp,
                   o.tp,
                   o.zero,
                   o.hsdp,
                   static_cast<int>(o.grad_accum),
                   o.recompute,
                   o.sequence_parallel,
                   o.recompute_layers,
                   o.pp,
                   o.schedule,
                   o.virtual_stages,
                   o.stage_layers,
                   o.offload,
                   o.cp,
                   o.cp_order,
                   o.cp_attention,
                   o.ep};
}

// The plan of a run on `ranks` ranks with its placements (the sharding search with --tp, the
// stage counts with --pp). `placed` gets the search's report.
Result<Plan> train_plan(const TrainOptions& o, const ModelConfig& cfg, int ranks,
                        std::string* placed) {
  // A framework's plan file is read as the flags it means.
  TS_ASSIGN_OR_RETURN(const PlanFlags flags, resolve_plan_file(plan_flags(o), ranks));
  TS_ASSIGN_OR_RETURN(Plan plan, plan_from_resolved(flags, o.plan, ranks, cfg.n_head));
  if (plan.mesh.size() == 1) return plan;  // one process: its --grad-accum and --recompute
  // Placements for this machine's ratio of FLOP/s to bytes/s between ranks (cpu-local's
  // figures; `tessera calibrate` measures them). The search is deterministic, so every rank
  // finds the same placements.
  TS_ASSIGN_OR_RETURN(ClusterSpec cpu, load_cluster("cpu-local"));
  // The full graph only serves to spread a searched layout over the blocks.
  const bool searched = flags.file.empty() && plan.tensor_group() > 1;
  ModelGraph m = searched ? build_model(cfg, o.batch, o.seq, ModelMode::train) : ModelGraph{};
  TS_ASSIGN_OR_RETURN(*placed,
                      place_parameters(flags, cfg, o.batch, o.seq, m.graph,
                                       SearchCost{flops_per_intra_byte(cpu, DType::f32)}, &plan));
  return plan;
}

// --plan auto: the planner's fastest plan for `ranks` ranks of --cluster, timed at f32 (what
// the CPU backend computes in), for the step's --batch x --grad-accum sequences; the split it
// chose (global micro-batch, micro-batches) is written back into the options. With `print`,
// why: the runners-up and, knob by knob, what the fastest other value costs.
Result<Plan> auto_plan(TrainOptions* o, const ModelConfig& cfg, int ranks, bool print) {
  if (o->dp > 0 || o->tp > 1 || o->pp > 1 || o->cp > 1 || !o->cp_order.empty() ||
      !o->cp_attention.empty() || o->ep > 1 || o->zero != 0 || o->hsdp > 0 ||
      !o->recompute.empty() || o->sequence_parallel || !o->schedule.empty() ||
      o->virtual_stages != -1 || !o->stage_layers.empty() || o->recompute_layers != -1 ||
      !o->offload.empty())
    return error(
        "--plan auto chooses the parallel configuration itself",
        "drop --dp/--tp/--pp/--cp/--cp-order/--cp-attention/--ep/--zero/--hsdp/--recompute/"
        "--offload/"
        "--sequence-parallel/--schedule (or give them without --plan auto)");
  TS_ASSIGN_OR_RETURN(ClusterSpec cluster, load_cluster(o->cluster));
  // The job's ranks all run on this machine: a spec without a network is one node of them all.
  if (cluster.network.nics == 0) cluster.node.devices = std::max(cluster.node.devices, ranks);
  PlannerOptions po;
  po.gpus = ranks;
  po.global_batch = o->batch * o->grad_accum;
  po.seq = o->seq;
  po.precision = DType::f32;
  po.top_k = 3;
  po.threads = 1;  // every rank searches (the same answer); one core each
  TS_ASSIGN_OR_RETURN(std::unique_ptr<PlanSpace> space, PlanSpace::create(cfg, cluster, po));
  TS_ASSIGN_OR_RETURN(PlanSearch s, search_plans(*space));
  const PlanCandidate& best = s.best[0];
  o->batch = best.micro_batch * best.plan.data_group();
  o->grad_accum = best.plan.micro_batches;
  if (print) {
    std::fprintf(stderr,
                 "plan auto: %d plans of %s for %d x %s (--cluster %s), %lld sequences per "
                 "step; %d simulated in %.1f s. Fastest that fit:\n",
                 s.enumerated, cfg.name.c_str(), ranks, cluster.device.name.c_str(),
                 o->cluster.c_str(), (long long)po.global_batch, s.simulated, s.seconds);
    for (size_t i = 0; i < s.best.size(); ++i)
      std::fprintf(stderr, "  %zu. %s: %.4f s per step, %s per rank\n", i + 1,
                   s.best[i].describe().c_str(), s.best[i].sim.step_seconds,
                   format_bytes(s.best[i].sim.peak_memory_bytes).c_str());
    TS_ASSIGN_OR_RETURN(Explanation e, explain_best(*space, /*what_ifs=*/false));
    std::fputs(format_explanation(e, cluster.device.memory_bytes).c_str(), stderr);
    std::fprintf(stderr, "plan auto: training with %s (--batch %lld --grad-accum %lld)\n",
                 best.describe().c_str(), (long long)o->batch, (long long)o->grad_accum);
    if (o->device == "cpu" && o->cluster != "cpu-local" && !o->cluster.ends_with(".toml"))
      std::fprintf(stderr,
                   "note: the plans were timed on %s (%s), not on this machine's CPUs: the "
                   "times above are that cluster's; `tessera calibrate` writes a spec of this "
                   "machine to plan for it\n",
                   o->cluster.c_str(), cluster.device.name.c_str());
  }
  return best.plan;
}

}  // namespace

// The model a run trains: --model, or with --init-from the checkpoint's (and --model, if
// given too, must be the same).
Result<ModelConfig> train_model(const TrainOptions& o) {
  if (o.init_from.empty()) return load_model_config(o.model);
  if (o.resume)
    return error(
        "--init-from starts a new run from a checkpoint's parameters and --resume "
        "continues a run in --out; pass one of them");
  TS_ASSIGN_OR_RETURN(ShardedCheckpoint ck, ShardedCheckpoint::open(o.init_from));
  if (!ck.manifest().contains("model"))
    return error("checkpoint " + ck.dir() + ": manifest.json has no model config");
  TS_ASSIGN_OR_RETURN(ModelConfig cfg, model_config_from_json(ck.manifest().at("model")));
  if (o.model_given) {
    TS_ASSIGN_OR_RETURN(ModelConfig flag, load_model_config(o.model));
    flag.name = cfg.name;
    if (!(flag == cfg))
      return error("--model " + o.model + " is not the model of --init-from " + ck.dir() + " (" +
                       cfg.name + ")",
                   "leave out --model to train the checkpoint's model");
  }
  return cfg;
}

Status run_train(const TrainOptions& options) {
  TrainOptions o = options;
  TS_ASSIGN_OR_RETURN(ModelConfig cfg, train_model(o));
  if (task_of(cfg) == ModelTask::image_classes) {
    // An image is its class token and patches: the sequence is the model's.
    if (o.seq_given && o.seq != cfg.image_tokens())
      return error("--seq " + std::to_string(o.seq) + ": " + cfg.name + " reads images as " +
                       std::to_string(cfg.image_tokens()) + " tokens (the class token and " +
                       std::to_string(cfg.patches()) + " patches)",
                   "leave --seq out for image models");
    o.seq = cfg.image_tokens();
  }
  TS_RETURN_IF_ERROR(check_train_options(o, cfg));
  // A run option, not the model's: checkpoints hold the f32 master weights.
  cfg.dtype = *parse_dtype(o.precision);  // checked: fp32 (f32), bf16 or fp16 (f16)
  const bool automatic = o.plan == "auto";
  // A framework's plan file may give a precision: it must be the run's (checked before launch's
  // check returns, so that it is printed once).
  if (!o.plan.empty() && !automatic) {
    TS_ASSIGN_OR_RETURN(const std::string file_precision, plan_file_precision(o.plan));
    if (!file_precision.empty() && file_precision != dtype_name(cfg.dtype))
      return error(
          "the plan file says " + file_precision + " and the run is " + dtype_name(cfg.dtype),
          file_precision == "fp8" ? "train runs f32, bf16 or f16 (fp8 is simulated only)"
                                  : "train with --precision " + file_precision);
  }
  // `tessera launch` asks, in one process before it starts the ranks, whether the flags make a
  // plan for that many ranks: a mistake is then printed once, not once per rank.
  if (const char* n = std::getenv("TESSERA_LAUNCH_CHECK")) {
    const int ranks = std::atoi(n);
    TS_RETURN_IF_ERROR(check_run_dir(o));
    TS_RETURN_IF_ERROR(check_device(o.device));
    if (automatic) {
      TS_RETURN_IF_ERROR(auto_plan(&o, cfg, std::max(ranks, 1), false).status());
    } else if (o.plan.empty() || ranks > 0) {
      std::string placed;
      TS_ASSIGN_OR_RETURN(Plan plan, train_plan(o, cfg, ranks, &placed));
      // A pipeline's cut and schedule are checked by lowering it once, here (each rank lowers
      // it again for its stage).
      if (plan.stages() > 1) {
        ModelGraph m = build_model(cfg, o.batch, o.seq, ModelMode::train);
        TS_RETURN_IF_ERROR(lower_pipeline(m.graph, plan).status());
      }
    }
    std::exit(0);
  }
  // A plan file that cannot be read is that error, whatever the number of processes.
  if (!o.plan.empty() && !automatic) TS_RETURN_IF_ERROR(check_plan_file(o.plan));
  // A distributed run: started by mpirun (or `tessera launch`), or asked for by flags or by a
  // plan file of more than one rank (a file's one-rank plan runs in this process).
  const bool rank_flags = o.dp > 1 || o.tp > 1 || o.pp > 1 || o.cp > 1 || o.ep > 1 || o.hsdp > 0;
  TS_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, join_mpi_job(o.collectives));
  bool plan_file_ranks = !o.plan.empty() && !automatic;
  int file_ranks = 2;  // the ranks the file's plan has, with its data degree left open as one
  if (plan_file_ranks && !world && !rank_flags) {
    TS_ASSIGN_OR_RETURN(const PlanFlags f, resolve_plan_file(plan_flags(o), 1));
    if (!f.file.empty()) {
      TS_ASSIGN_OR_RETURN(const Plan p, load_plan(f.file));
      file_ranks = p.mesh.size();
    } else {
      file_ranks = std::max(f.dp, 1) * f.tp * f.pp * f.cp * f.ep;
    }
    plan_file_ranks = file_ranks > 1;  // else its errors are train_plan's, below
  }
  const bool wants_ranks = rank_flags || plan_file_ranks;
  if (world) {
    world->set_timeout(o.comm_timeout);
  } else if (wants_ranks) {
    int n = rank_flags ? std::max(o.dp, 1) * std::max(o.tp, 1) * std::max(o.pp, 1) *
                             std::max(o.cp, 1) * std::max(o.ep, 1)
                       : file_ranks;
    if (n == 1) n = 2;
    return error("a distributed plan needs one process per rank",
                 "run `tessera launch -n " + std::to_string(n) + " -- train ...` or `mpirun -np " +
                     std::to_string(n) + " tessera train ...`");
  }
  const bool distributed = world && (world->size() > 1 || wants_ranks);
  const int ranks = world ? world->size() : 1;
  TS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> device, open_device(o.device));
  std::unique_ptr<Communicator> device_world;
  if (distributed) {
    TS_ASSIGN_OR_RETURN(device_world, open_device_comms(*world, device.get()));
    if (device_world) device_world->set_timeout(o.comm_timeout);
  }
  if (automatic) {
    TS_ASSIGN_OR_RETURN(Plan plan,
                        auto_plan(&o, cfg, distributed ? ranks : 1, !world || world->rank() == 0));
    return train(o, TrainJob{cfg, std::move(plan), world.get(), default_data_dir(), device.get(),
                             device_world.get()});
  }
  std::string placed;
  TS_ASSIGN_OR_RETURN(Plan plan, train_plan(o, cfg, distributed ? ranks : 1, &placed));
  if (distributed && world->rank() == 0 && !placed.empty()) std::fputs(placed.c_str(), stderr);
  return train(o, TrainJob{cfg, std::move(plan), world.get(), default_data_dir(), device.get(),
                           device_world.get()});
}

void add_train_command(CLI::App& app, TrainOptions& o) {
  CLI::App* cmd =
      app.add_subcommand("train", "Train a model (defaults: gpt-mini on the shipped corpus)");
  CLI::Option* model = cmd->add_option("--model", o.model, "Preset name or config.toml");
  model->capture_default_str();
  cmd->add_option("--data", o.data,
                  "A folder `tessera tokenize` wrote (train and val shards, manifest.json), or "
                  "of token shards whose names say train and val (llm.c's .bin shards read as "
                  "they are), or a weighted mixture of such folders, FOLDER=WEIGHT,... (e.g. "
                  "web=0.7,code=0.3) (default: the shipped corpus, under the build's data/ or "
                  "$TESSERA_DATA_DIR); for image models a folder of IDX files, or fashion-mnist "
                  "(the default)");
  cmd->add_option("--out", o.out, "Run directory: metrics.jsonl and checkpoints/")
      ->capture_default_str();
  cmd->add_option("--batch", o.batch, "Sequences per micro-batch")->capture_default_str();
  CLI::Option* seq =
      cmd->add_option("--seq", o.seq, "Tokens per sequence (image models: their image tokens)")
          ->capture_default_str();
  cmd->add_option("--steps", o.steps, "Optimizer steps in total")->capture_default_str();
  cmd->add_option("--grad-accum", o.grad_accum, "Micro-batches per step")->capture_default_str();
  cmd->add_option("--lr", o.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "Linear warmup steps")->capture_default_str();
  cmd->add_option("--min-lr-frac", o.min_lr_frac, "Final LR as a fraction of the peak (cosine)")
      ->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay")
      ->capture_default_str();
  cmd->add_option("--clip", o.clip, "Global gradient-norm clip (0: off)")->capture_default_str();
  cmd->add_option("--eval-every", o.eval_every, "Validation every N steps (0: only at the end)")
      ->capture_default_str();
  cmd->add_option("--eval-batches", o.eval_batches, "Validation batches")->capture_default_str();
  cmd->add_option("--ckpt-every", o.ckpt_every, "Checkpoint every N steps (0: only at the end)")
      ->capture_default_str();
  cmd->add_option("--keep-ckpts", o.keep_ckpts, "Checkpoints to keep")->capture_default_str();
  cmd->add_option("--log-every", o.log_every, "Log line every N steps when not on a terminal")
      ->capture_default_str();
  cmd->add_option("--sample-tokens", o.sample_tokens, "Tokens to sample at the end")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed for initialization and data order")
      ->check(CLI::Validator(
          [](const std::string& v) {
            return v.empty() || v[0] != '-' ? std::string() : "must be 0 or positive, got " + v;
          },
          "SEED"))
      ->capture_default_str();
  cmd->add_flag("--resume", o.resume, "Continue from the latest checkpoint in --out");
  cmd->add_option("--init-from", o.init_from,
                  "Start a new run from a checkpoint's parameters (any plan; e.g. one `tessera "
                  "import hf` wrote), training its model with a fresh optimizer");
  cmd->add_option("--peak-flops", o.peak_flops,
                  "Per-rank peak FLOP/s that MFU is reported against (e.g. peak_flops_f32 of "
                  "`tessera calibrate`'s spec); default: measured with a GEMM at the start");
  cmd->add_option("--stop-after", o.stop_after,
                  "Stop after N steps of this run, saving a checkpoint");
  cmd->add_flag("--sync-checkpoints", o.sync_checkpoints,
                "Write checkpoints while the training waits (by default their files are written "
                "by a thread of their own during the next step, from a host copy of the state)");
  cmd->add_option("--trace", o.trace,
                  "Write a Chrome/Perfetto trace of one step here (every rank's compute and its "
                  "rank groups' collectives on their comm streams; open it in ui.perfetto.dev)");
  cmd->add_option("--trace-step", o.trace_step,
                  "The step --trace records (default: the second of this run)");
  cmd->add_option("--dp", o.dp, "Data-parallel ranks (default: the mpirun world size / --tp)");
  cmd->add_option("--tp", o.tp,
                  "Tensor-parallel ranks: consecutive ranks, placements found by the sharding "
                  "search")
      ->capture_default_str();
  cmd->add_option("--zero", o.zero, "ZeRO stage: 0 DP, 1 optimizer state, 2 + gradients, 3 FSDP")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  cmd->add_option("--hsdp", o.hsdp,
                  "HSDP: this many replica groups, ZeRO-3 within each (ranks / N per group)");
  cmd->add_option("--plan", o.plan,
                  "Plan JSON (see `tessera plan`; overrides --dp/--tp/--zero/--hsdp), or auto: "
                  "the planner picks the plan for the job's ranks and splits --batch x "
                  "--grad-accum sequences per step into micro-batches, and prints why");
  CLI::Option* cluster =
      cmd->add_option("--cluster", o.cluster,
                      "With --plan auto: the cluster spec plans are timed on (a preset, or the "
                      ".toml `tessera calibrate` wrote for this machine)")
          ->capture_default_str();
  cmd->add_option("--pp", o.pp,
                  "Pipeline stages: the outermost mesh axis, each stage a contiguous run of "
                  "blocks (balanced by FLOPs, embedding and LM head counted, unless "
                  "--stage-layers); --grad-accum is the number of micro-batches")
      ->capture_default_str();
  cmd->add_option("--schedule", o.schedule,
                  "Pipeline schedule: gpipe, 1f1b (default), interleaved (with "
                  "--virtual-stages) or zb-h1 (zero-bubble: backward split into input and "
                  "weight gradients)");
  cmd->add_option("--virtual-stages", o.virtual_stages,
                  "Model chunks per stage for --schedule interleaved");
  cmd->add_option("--stage-layers", o.stage_layers,
                  "Blocks per model chunk, comma-separated (e.g. 3,5), summing to the model's "
                  "blocks");
  cmd->add_flag("--sequence-parallel", o.sequence_parallel,
                "Sequence parallelism with --tp: norms and residual adds split on the sequence "
                "over the tensor-parallel ranks (reduce-scatter + all-gather instead of "
                "all-reduce; less activation memory)");
  cmd->add_option("--recompute", o.recompute,
                  "Activation recomputation: none; full (each block's forward again in the "
                  "backward pass: least activation memory, ~20% more FLOPs); or selective (only "
                  "the cheap ops between matmuls and attention again: a few % more FLOPs). "
                  "Default: the plan's, or none");
  cmd->add_option("--recompute-layers", o.recompute_layers, kRecomputeLayersHelp);
  cmd->add_option("--offload", o.offload, kOffloadHelp);
  cmd->add_option("--cp", o.cp, kContextParallelHelp)->capture_default_str();
  cmd->add_option("--cp-order", o.cp_order, kContextOrderHelp);
  cmd->add_option("--cp-attention", o.cp_attention, kContextAttentionHelp);
  cmd->add_option("--ep", o.ep, kExpertParallelHelp)->capture_default_str();
  cmd->add_option("--precision", o.precision,
                  "fp32; bf16 or fp16: parameters, activations and gradients in it with f32 "
                  "master weights and AdamW state (fp16 with dynamic loss scaling; GPT and "
                  "LLaMA, any plan; f32 and f16 are the same names)")
      ->capture_default_str();
  cmd->add_option("--device", o.device,
                  "cpu; or cuda: the step on NVIDIA GPUs (sm_80 or newer) through the same step "
                  "runner, in device memory: GPU 0 in one process, or each rank of a job on its "
                  "node-local rank's GPU (the step's collectives through NCCL when each rank has "
                  "a GPU of its own, else staged through host memory over MPI)")
      ->capture_default_str();
  cmd->add_option("--comm-timeout", o.comm_timeout,
                  "Seconds a collective waits for a peer before the run fails")
      ->capture_default_str();
  cmd->add_option("--collectives", o.collectives, kCollectivesHelp)
      ->check(CLI::IsMember({"auto", "ring", "mpi"}))
      ->capture_default_str();
  cmd->callback([&o, model, seq, cluster] {
    o.model_given = model->count() > 0;
    o.seq_given = seq->count() > 0;
    if (cluster->count() > 0 && o.plan != "auto")  // it would be silently ignored
      exit_on_error(
          error("--cluster " + o.cluster + " applies to --plan auto",
                "add --plan auto to search the plans on that cluster, or drop --cluster"));
    exit_on_error(run_train(o));
  });
}

}  // namespace tessera
