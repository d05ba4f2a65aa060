#include "train/trainer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "base/check.h"
#include "base/format.h"
#include "data/image_set.h"
#include "data/loader.h"
#include "data/mixture_loader.h"
#include "data/span_corruption.h"
#include "data/tokenize_corpus.h"
#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "ir/builder.h"
#include "runtime/optimizer.h"
#include "runtime/step_trace.h"
#include "train/mfu_peak.h"
#include "train/progress.h"
#include "train/run_control.h"
#include "train/run_metrics.h"
#include "train/train_state.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// A --data folder: it exists, is a folder, and holds token shards.
Status check_data_dir(const std::string& dir) {
  if (!fs::exists(dir))
    return error("data path '" + dir + "' does not exist",
                 "create it with `tessera tokenize --input TEXT --out " + dir + "`");
  if (!fs::is_directory(dir))
    return error("data path '" + dir +
                     "' is a file; --data takes the directory holding train.bin and val.bin "
                     "(or a folder of llm.c shards)",
                 "tokenize a text into a directory with `tessera tokenize --input TEXT --out "
                 "DIR`, then pass --data DIR");
  return find_token_shards(dir).status();
}

// Every folder of a --data mixture, checked as one, and tokenized by one tokenizer: folders
// tokenized by different ones would mix ids of different meanings.
Status check_mixture(const MixtureSpec& spec) {
  const std::string first = data_tokenizer_identity(spec.dirs[0]);
  for (const std::string& dir : spec.dirs) {
    TS_RETURN_IF_ERROR(check_data_dir(dir));
    const std::string identity = data_tokenizer_identity(dir);
    if (!identity.empty() && !first.empty() && identity != first)
      return error("--data mixture: '" + dir + "' was tokenized by another tokenizer than '" +
                       spec.dirs[0] + "' (their manifests differ)",
                   "tokenize every folder of a mixture with the same --tokenizer");
  }
  return Status();
}

// The data directory, tokenizing the shipped corpus on first use when no --data was given.
Result<std::string> prepare_data(const TrainOptions& o, const std::optional<Tokenizer>& tok,
                                 const std::string& shipped) {
  if (!o.data.empty()) {
    TS_RETURN_IF_ERROR(check_data_dir(o.data));
    return o.data;
  }
  std::string dir = shipped + "/corpus";
  if (fs::exists(dir + "/train.bin") && fs::exists(dir + "/val.bin")) return dir;
  std::string text = dir + "/moby_dick.txt";
  std::fprintf(stderr, "tokenizing the shipped corpus %s (once)...\n", text.c_str());
  Status s = tokenize_corpus(text, dir, 0.05, *tok);  // loaded when there is no --data
  if (!s.ok())
    return error(s.message(),
                 "tokenize the corpus into a writable directory with `tessera "
                 "tokenize --input " +
                     text + " --out DIR` and pass --data DIR");
  return dir;
}

// Where `--data fashion-mnist` (and no --data, for image models) reads from: Debian's
// dataset-fashion-mnist, or $TESSERA_FASHION_MNIST_DIR.
std::string fashion_mnist_dir() {
  const char* env = std::getenv("TESSERA_FASHION_MNIST_DIR");
  return env ? env : "/usr/share/datasets/fashion-mnist";
}

// What a run reads: its training and validation streams (this rank's rows), and for image
// models the validation batches whole, for rank 0's accuracy.
struct RunData {
  std::unique_ptr<BatchStream> train, val, val_whole;
  std::optional<Tokenizer> tok;  // language models
};

// `chunk` of `chunks`: the part of every sequence this rank's graph takes (context
// parallelism; 0 of 1 without).
Result<RunData> open_data(const TrainOptions& o, const TrainJob& job, int data_index,
                          int data_ranks, int chunk, int chunks) {
  const ModelConfig& cfg = job.cfg;
  const int rows = static_cast<int>(o.batch / data_ranks);
  RunData d;
  std::optional<MixtureSpec> mixture;
  if (is_mixture_spec(o.data)) {
    if (task_of(cfg) != ModelTask::language_model)
      return error("a --data mixture (FOLDER=WEIGHT,...) feeds language models (gpt, llama); " +
                       cfg.name + " is a " + cfg.family + " model",
                   "pass one --data folder for it");
    TS_ASSIGN_OR_RETURN(MixtureSpec spec, parse_mixture_spec(o.data));
    TS_RETURN_IF_ERROR(check_mixture(spec));
    mixture = std::move(spec);
  }
  if (chunks > 1 && task_of(cfg) != ModelTask::language_model)
    return error("context parallelism splits the sequences of language models (gpt, llama); " +
                     cfg.name + " is a " + cfg.family + " model",
                 "drop --cp for this model");
  if (task_of(cfg) == ModelTask::image_classes) {
    const std::string dir =
        o.data.empty() || o.data == "fashion-mnist" ? fashion_mnist_dir() : o.data;
    if (!fs::exists(dir) && dir == fashion_mnist_dir())
      return error("Fashion-MNIST is not installed at " + dir,
                   "install Debian's dataset-fashion-mnist (scripts/install_deps.sh does), or "
                   "pass --data DIR with a folder of IDX files");
    std::shared_ptr<ImageSet> sets[2];
    const char* splits[2] = {"train", "t10k"};
    for (int i = 0; i < 2; ++i) {
      TS_ASSIGN_OR_RETURN(ImageSet set, ImageSet::open(dir, splits[i]));
      TS_RETURN_IF_ERROR(check_images_fit(set, cfg.channels, cfg.image_size, cfg.vocab_size));
      sets[i] = std::make_shared<ImageSet>(std::move(set));
    }
    TS_ASSIGN_OR_RETURN(ImageLoader train,
                        ImageLoader::open(sets[0], rows, data_index, data_ranks, o.seed));
    TS_ASSIGN_OR_RETURN(ImageLoader val,
                        ImageLoader::open(sets[1], rows, data_index, data_ranks, 0));
    TS_ASSIGN_OR_RETURN(ImageLoader whole,
                        ImageLoader::open(sets[1], static_cast<int>(o.batch), 0, 1, 0));
    d.train = std::make_unique<ImageLoader>(std::move(train));
    d.val = std::make_unique<ImageLoader>(std::move(val));
    d.val_whole = std::make_unique<ImageLoader>(std::move(whole));
    return d;
  }
  // The tokenizer: to tokenize the shipped corpus (no --data) and to sample at the end; the
  // one a tokenized folder's manifest names (copied into the run directory for `sample`).
  if (o.data.empty() || task_of(cfg) == ModelTask::language_model) {
    // A mixture's folders share a tokenizer (check_mixture): the first's.
    const std::string named =
        o.data.empty() ? "" : data_tokenizer(mixture ? mixture->dirs[0] : o.data);
    if (o.data.empty() || o.sample_tokens > 0 || !named.empty()) {
      TS_ASSIGN_OR_RETURN(Tokenizer tok,
                          Tokenizer::load(named.empty() ? job.shipped_data_dir + "/gpt2" : named));
      d.tok = std::move(tok);
    }
  }
  std::string data_dir;  // a mixture's folders are checked above
  if (!mixture) {
    TS_ASSIGN_OR_RETURN(data_dir, prepare_data(o, d.tok, job.shipped_data_dir));
  }
  const int seq = static_cast<int>(o.seq);
  if (task_of(cfg) == ModelTask::span_corruption) {
    const int text_vocab = kGpt2VocabSize;
    TS_ASSIGN_OR_RETURN(SpanCorruptionLoader train,
                        SpanCorruptionLoader::open(data_dir + "/train.bin", text_vocab, rows, seq,
                                                   data_index, data_ranks, o.seed));
    TS_ASSIGN_OR_RETURN(SpanCorruptionLoader val,
                        SpanCorruptionLoader::open(data_dir + "/val.bin", text_vocab, rows, seq,
                                                   data_index, data_ranks, 0));
    d.train = std::make_unique<SpanCorruptionLoader>(std::move(train));
    d.val = std::make_unique<SpanCorruptionLoader>(std::move(val));
    return d;
  }
  const int vocab = static_cast<int>(cfg.vocab_size);
  const bool zigzag = job.plan.context_order == ContextOrder::zigzag;
  if (mixture) {
    const MixtureSpec& spec = *mixture;
    std::vector<std::vector<std::string>> train_shards, val_shards;
    for (const std::string& dir : spec.dirs) {
      TS_ASSIGN_OR_RETURN(ShardFiles files, find_token_shards(dir));
      train_shards.push_back(files.train);
      val_shards.push_back(files.val);
    }
    TS_ASSIGN_OR_RETURN(MixtureLoader train,
                        MixtureLoader::open(train_shards, spec.weights, vocab, rows, seq,
                                            data_index, data_ranks, o.seed));
    TS_ASSIGN_OR_RETURN(
        MixtureLoader val,
        MixtureLoader::open(val_shards, spec.weights, vocab, rows, seq, data_index, data_ranks, 0));
    TS_RETURN_IF_ERROR(train.set_sequence_chunk(chunk, chunks, zigzag));
    TS_RETURN_IF_ERROR(val.set_sequence_chunk(chunk, chunks, zigzag));
    d.train = std::make_unique<MixtureLoader>(std::move(train));
    d.val = std::make_unique<MixtureLoader>(std::move(val));
    return d;
  }
  TS_ASSIGN_OR_RETURN(ShardFiles files, find_token_shards(data_dir));
  TS_ASSIGN_OR_RETURN(DataLoader train, DataLoader::open(files.train, vocab, rows, seq, data_index,
                                                         data_ranks, o.seed));
  TS_ASSIGN_OR_RETURN(DataLoader val,
                      DataLoader::open(files.val, vocab, rows, seq, data_index, data_ranks, 0));
  TS_RETURN_IF_ERROR(train.set_sequence_chunk(chunk, chunks, zigzag));
  TS_RETURN_IF_ERROR(val.set_sequence_chunk(chunk, chunks, zigzag));
  d.train = std::make_unique<DataLoader>(std::move(train));
  d.val = std::make_unique<DataLoader>(std::move(val));
  return d;
}

// The validation loss over `batches` global batches, evaluated under the training plan: each
// data-parallel rank feeds its rows of each batch, and every rank gets the global mean.
Result<double> evaluate(TrainState& st, BatchStream& val, int64_t batches) {
  Status s = val.restore(st.val_start);
  TS_CHECK(s.ok()) << s.to_string();
  HostBatch batch;
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    batch.clear();
    val.next(&batch);
    TS_ASSIGN_OR_RETURN(float loss, st.evaluate(feed_of(batch)));
    total += loss;
  }
  return total / static_cast<double>(batches);
}

// Test hook: TESSERA_FAULT_KILL_RANK=r TESSERA_FAULT_KILL_STEP=s kills rank r in step s. With
// TESSERA_FAULT_KILL_ONCE=FILE only the first time (the file records it), so a restarted job
// (`launch --elastic`) runs through.
void maybe_kill(int rank, int64_t step) {
  const char* r = std::getenv("TESSERA_FAULT_KILL_RANK");
  const char* s = std::getenv("TESSERA_FAULT_KILL_STEP");
  if (!r || !s || std::atoi(r) != rank || std::atoll(s) != step) return;
  if (const char* once = std::getenv("TESSERA_FAULT_KILL_ONCE")) {
    const int fd = ::open(once, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return;  // already happened
    ::close(fd);
  }
  std::fprintf(stderr, "tessera: rank %d: killed by TESSERA_FAULT_KILL_* in step %lld\n", rank,
               (long long)step);
  std::raise(SIGKILL);
}

// A run that diverged: what went non-finite in which step, and how to go on.
Status diverged(int64_t step, const std::string& what, int64_t last_saved, const TrainOptions& o) {
  return error("step " + std::to_string(step + 1) + ": the " + what +
                   " went non-finite (NaN or infinity); the run stops here and saves no "
                   "checkpoint of it",
               (last_saved >= 0 ? "the last good checkpoint is step " + std::to_string(last_saved) +
                                      " in " + o.out + "/checkpoints (--resume continues from it); "
                                : std::string("no checkpoint was saved before; ")) +
                   "try a lower --lr (now " + number_text(o.lr) + ")" +
                   (o.clip == 0 || o.clip > 1 ? " or --clip 1.0" : std::string()));
}

// The ranks' start-up results, agreed on: OK when every rank started; else the first failing
// rank's own error on that rank, and on the others an error it has reported (the CLI exits
// non-zero without printing it again), so the job's error is printed once and no rank is left
// waiting in a collective for one that has stopped.
Status agree_on_start(Communicator* world, const Status& mine) {
  if (world == nullptr || world->size() == 1) return mine;
  const int me = mine.ok() ? world->size() : world->rank();
  TS_ASSIGN_OR_RETURN(const double first,
                      world->all_reduce_scalar(-me, /*max=*/true, "start-up check"));
  const int failed = static_cast<int>(-first);  // the lowest failing rank, or size()
  if (failed == world->size()) return Status();
  if (failed == world->rank()) return mine;
  return Status::reported_elsewhere("rank " + std::to_string(world->rank()) + ": stopped: rank " +
                                    std::to_string(failed) +
                                    " could not start (its error says why)");
}

// --trace: every rank's spans of the step, gathered on rank 0, which writes the file.
// Collective.
Status write_trace(const TrainOptions& o, Communicator* world, const TrainState& st,
                   const StepTrace& trace, int64_t step) {
  std::vector<std::pair<int, std::vector<TraceSpan>>> ranks = {{0, trace.spans()}};
  if (world && world->size() > 1) {
    // Each rank's spans as JSON text, padded to the longest, gathered as 32-bit words.
    std::string text = spans_to_json(ranks[0].second);
    TS_ASSIGN_OR_RETURN(
        const double longest,
        world->all_reduce_scalar(static_cast<double>(text.size()), true, "trace size"));
    const int64_t words = (static_cast<int64_t>(longest) + 4) / 4;
    text.resize(static_cast<size_t>(words * 4), '\0');
    std::string all(static_cast<size_t>(words * 4 * world->size()), '\0');
    TS_RETURN_IF_ERROR(
        world->wait(world->all_gather(text.data(), all.data(), words, DType::i32, "trace")));
    ranks.clear();
    for (int r = 0; r < world->size(); ++r) {
      const std::string one =
          all.substr(static_cast<size_t>(r * words * 4), static_cast<size_t>(words * 4));
      ranks.push_back({r, spans_from_json(one.substr(0, one.find('\0')))});
    }
    if (world->rank() != 0) return Status();
  }
  TS_RETURN_IF_ERROR(write_file_atomic(
      o.trace, chrome_trace_json(ranks, st.cfg.name + " " + st.plan().describe())));
  std::fprintf(stderr,
               "step %lld: trace of %zu rank%s written to %s (open it in ui.perfetto.dev)\n",
               (long long)(step + 1), ranks.size(), ranks.size() == 1 ? "" : "s", o.trace.c_str());
  return Status();
}

// This process's resident memory (Linux's /proc/self/status), 0 where unknown: its high-water
// (VmHWM), and now its private memory (RssAnon) and its pages of mapped files (RssFile: the
// program's code and libraries, the token shards read).
struct ResidentMemory {
  int64_t peak = 0, anon = 0, file = 0;
};
ResidentMemory resident_memory() {
  ResidentMemory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "VmHWM: %lld kB", &kib) == 1) m.peak = kib * 1024;
    if (std::sscanf(line.c_str(), "RssAnon: %lld kB", &kib) == 1) m.anon = kib * 1024;
    if (std::sscanf(line.c_str(), "RssFile: %lld kB", &kib) == 1) m.file = kib * 1024;
  }
  return m;
}

// A rank's peak resident memory against its plan: what the plan names (with a checkpoint's
// snapshot), the private memory the process held before training, the pages of mapped files
// (program, libraries, token shards read), and the rest, which the plan does not name.
// Printed by rank 0, and by any rank whose rest is more than 10% of the others. On a GPU the
// plan's bytes are device memory, so there is nothing to compare.
void report_resident_memory(const TrainState& st, const ResidentMemory& at_start,
                            const Communicator* world) {
  const ResidentMemory m = resident_memory();
  if (m.peak == 0 || st.backend.memory() == MemSpace::device) return;
  const int64_t planned = st.planned_process_bytes();
  const int64_t named = planned + at_start.anon + m.file;
  const int64_t rest = m.peak - named;
  const bool over = 10 * rest > named;
  if (!st.is_leader() && !over) return;
  auto b = [](int64_t n) { return format_bytes(static_cast<double>(n)); };
  std::fprintf(stderr,
               "%speak resident memory %s = the plan's %s + %s held at start-up + %s of mapped "
               "files (the program, its libraries, the token shards read) %s %s the plan does "
               "not name (%+.1f%%)%s\n",
               world ? ("rank " + std::to_string(world->rank()) + ": ").c_str() : "",
               b(m.peak).c_str(), b(planned).c_str(), b(at_start.anon).c_str(), b(m.file).c_str(),
               rest >= 0 ? "+" : "-", b(rest >= 0 ? rest : -rest).c_str(),
               100.0 * static_cast<double>(rest) / static_cast<double>(named),
               over ? "  OVER THE PLAN" : "");
}

// The arena's measured high-water after the first step against the plan: printed by rank 0 and
// by the first rank of every pipeline stage, and by any rank where they differ.
void report_arena(const TrainState& st, const Communicator* world) {
  const int64_t hw = st.measured_arena_bytes(), planned = st.planned_arena_bytes();
  const int stage = st.step->stage();  // -1 without stages
  const bool stage_lead = stage >= 0 &&
                          st.plan().mesh.group_index(st.rank, st.plan().data_axes) == 0 &&
                          (st.plan().tensor_axes.empty() ||
                           st.plan().mesh.group_index(st.rank, st.plan().tensor_axes) == 0);
  if (!st.is_leader() && !stage_lead && hw == planned) return;
  std::string who = world ? "rank " + std::to_string(world->rank()) + ": " : std::string();
  if (stage >= 0) who += "stage " + std::to_string(stage) + ": ";
  std::fprintf(stderr, "%smeasured arena high-water %s (planned %s)%s\n", who.c_str(),
               format_bytes(static_cast<double>(hw)).c_str(),
               format_bytes(static_cast<double>(planned)).c_str(),
               hw == planned ? "" : "  MISMATCH");
}

}  // namespace

Status check_run_dir(const TrainOptions& o) {
  const bool has_checkpoint = fs::exists(fs::path(o.out) / "checkpoints" / "latest");
  if (o.resume && !has_checkpoint)
    return error(
        "--resume: run directory '" + o.out + "' holds no checkpoint to continue from",
        "drop --resume to start a new run there, or pass the --out of the run to continue");
  if (!o.resume && has_checkpoint)
    return error("run directory '" + o.out + "' already holds checkpoints",
                 "pass --resume to continue that run, or choose another --out");
  return Status();
}

Status train(const TrainOptions& o, const TrainJob& job) {
  const ResidentMemory at_start = resident_memory();
  const ModelConfig& cfg = job.cfg;
  const Plan& plan = job.plan;
  Communicator* world = job.world;
  const bool distributed = world != nullptr && world->size() > 1;
  const int ranks = world ? world->size() : 1;
  const int data_ranks = distributed ? plan.data_group() : 1;
  const int data_index = distributed ? plan.mesh.group_index(world->rank(), plan.data_axes) : 0;
  const int chunks = distributed ? plan.context_group() : 1;
  const int chunk = chunks > 1 ? plan.mesh.group_index(world->rank(), {plan.context_axis}) : 0;
  const bool leader = !world || world->rank() == 0;
  // Start-up, each rank on its own: the data, the run directory and (rank 0) its lock. A
  // failure on any rank is agreed on before the first collective (agree_on_start), so that no
  // rank waits in one for a rank that has stopped.
  std::optional<RunData> opened;
  std::optional<RunDirLock> lock;
  std::ofstream metrics;
  Status started = [&]() -> Status {
    TS_ASSIGN_OR_RETURN(RunData d, open_data(o, job, data_index, data_ranks, chunk, chunks));
    opened.emplace(std::move(d));
    TS_RETURN_IF_ERROR(check_run_dir(o));
    TS_RETURN_IF_ERROR(make_dirs(o.out));
    // One run per directory; what a killed run left half-written goes (rank 0 does both,
    // before any rank can write a checkpoint).
    if (!leader) return Status();
    TS_ASSIGN_OR_RETURN(RunDirLock l, RunDirLock::acquire(o.out));
    lock.emplace(std::move(l));
    if (opened->tok) TS_RETURN_IF_ERROR(opened->tok->copy_to(o.out));  // for sample, export
    if (!o.resume) {
      TS_ASSIGN_OR_RETURN(metrics, open_run_metrics(o.out, false, 0));
    }
    // Checkpoints go under <out>/checkpoints: find out now, not after the first steps, when
    // they cannot.
    const std::string ckpts = (fs::path(o.out) / "checkpoints").string();
    TS_RETURN_IF_ERROR(make_dirs(ckpts));
    if (::access(ckpts.c_str(), W_OK | X_OK) != 0)
      return error("cannot write checkpoints in '" + ckpts + "': " + std::strerror(errno),
                   "choose an --out you can write, or fix the directory's permissions");
    TS_ASSIGN_OR_RETURN(int stale, remove_stale_staging(o.out));
    if (stale > 0)
      std::fprintf(stderr,
                   "removed %d unfinished checkpoint staging director%s of an earlier run\n", stale,
                   stale == 1 ? "y" : "ies");
    return Status();
  }();
  TS_RETURN_IF_ERROR(agree_on_start(world, started));
  RunData& data = *opened;
  BatchStream& train = *data.train;
  BatchStream& val = *data.val;
  const bool images = task_of(cfg) == ModelTask::image_classes;
  const LoaderState whole_start = data.val_whole ? data.val_whole->state() : LoaderState{};

  CpuBackend cpu;
  Backend& backend = job.backend != nullptr ? *job.backend : cpu;
  std::optional<MeshComms> comms;
  if (world) {
    TS_ASSIGN_OR_RETURN(comms, MeshComms::create(*world, plan, job.device_world));
    comms->set_timeout(o.comm_timeout);
  } else {
    TS_ASSIGN_OR_RETURN(comms, MeshComms::single(plan));
  }
  // This rank's state and where it starts from (a checkpoint, another run's parameters, the
  // seed): rank-local work, agreed on as the start-up was.
  std::unique_ptr<TrainState> state;
  int64_t start_step = 0;
  Status loaded = [&]() -> Status {
    TS_ASSIGN_OR_RETURN(state, TrainState::create(cfg, o, backend, *comms, plan));
    TrainState& st = *state;
    st.val_start = val.state();
    if (o.resume) {
      TS_ASSIGN_OR_RETURN(start_step, st.load(o.out + "/checkpoints", &train));
      // A 'latest' pointed back at an older checkpoint would redo steps whose checkpoints
      // exist and fail on the first save: say so now.
      TS_ASSIGN_OR_RETURN(std::vector<std::string> saved, list_checkpoints(o.out + "/checkpoints"));
      const std::string resumed = checkpoint_name(start_step);
      for (const std::string& n : saved)
        if (n.rfind("step-", 0) == 0 && n > resumed)
          return error("--resume: 'latest' in " + o.out + "/checkpoints names " + resumed +
                           ", but the newer " + n + " is there too",
                       "point 'latest' at " + n +
                           " to continue from it, or delete the newer "
                           "checkpoints to redo their steps");
      if (start_step >= o.steps)
        return error("--steps " + std::to_string(o.steps) + ": the run in '" + o.out +
                         "' has already taken " + std::to_string(start_step) + " steps",
                     "pass a larger --steps to train it further");
      if (!leader) return Status();
      // The steps the stopped run took after its last checkpoint (its records say how far it
      // got) are redone: a requeued Slurm job's log says how many.
      const int64_t reached = last_recorded_step(o.out) + 1;
      TS_ASSIGN_OR_RETURN(metrics, open_run_metrics(o.out, true, start_step));
      if (reached > start_step)
        std::fprintf(
            stderr,
            "resumed from step %lld (the run before reached step %lld: %lld step%s redone)\n",
            (long long)start_step, (long long)reached, (long long)(reached - start_step),
            reached - start_step == 1 ? "" : "s");
      else
        std::fprintf(stderr, "resumed from step %lld\n", (long long)start_step);
      if (!st.resume_changes.empty()) {
        std::string list;
        for (const std::string& c : st.resume_changes) list += (list.empty() ? "" : ", ") + c;
        std::fprintf(stderr,
                     "note: resumed with %s; the schedule goes on with the new values "
                     "(metrics.jsonl keeps each step's lr)\n",
                     list.c_str());
      }
    } else if (!o.init_from.empty()) {
      TS_RETURN_IF_ERROR(st.init_params_from(o.init_from));
    } else {
      st.init_params(o.seed);
    }
    return Status();
  }();
  TS_RETURN_IF_ERROR(agree_on_start(world, loaded));
  TrainState& st = *state;
  if (!o.resume && !o.init_from.empty()) {
    TS_ASSIGN_OR_RETURN(const bool finite, st.params_finite());
    if (!finite)
      return error("--init-from " + o.init_from +
                       ": the checkpoint's parameters hold values that are not finite (NaN or "
                       "infinity)",
                   "the checkpoint is damaged; start from another one");
    if (leader) std::fprintf(stderr, "parameters from %s\n", o.init_from.c_str());
  }

  // Throughput counts tokens (language models; T5's encoder inputs) or images.
  const double tokens_per_step =
      static_cast<double>(o.batch * (images ? 1 : tokens_per_example(cfg, o.seq)) * o.grad_accum);
  const char* rate_key = images ? "images_per_s" : "tokens_per_s";
  // MFU: the model's FLOPs (the global training graph, once; recomputation not counted) per
  // second and rank, against the rank's peak.
  const double model_flops_per_step =
      st.model.graph.total_flops() * static_cast<double>(o.grad_accum);
  const MfuPeak mfu = mfu_peak(backend, cfg.dtype, o.peak_flops);
  const double peak = mfu.flops;
  if (leader) std::fputs(st.describe_memory().c_str(), stderr);

  Progress progress(o.steps, start_step, leader ? o.log_every : 0, images ? "img/s" : "tok/s");
  HostBatch batch;
  auto t_start = Clock::now();
  int64_t steps_this_run = 0;
  int64_t last_saved = o.resume ? start_step : -1;  // the newest complete checkpoint
  // Publishes the checkpoint in flight, if any (every rank at the same point: collective).
  auto publish_checkpoint = [&]() -> Status {
    if (!st.save_in_flight()) return Status();
    TS_ASSIGN_OR_RETURN(last_saved, st.finish_save());
    if (leader) progress.note("step " + std::to_string(last_saved) + ": checkpoint saved");
    return Status();
  };
  double step_secs = 0;        // in training steps (no eval, checkpoints)
  double first_step_secs = 0;  // this run's first (start-up, graph recording): told apart
  install_stop_signals();
  // --trace: the step recorded (0-based), by default this run's second (or its only) one.
  const int64_t traced = o.trace.empty()    ? -1
                         : o.trace_step > 0 ? o.trace_step - 1
                                            : std::min(start_step + 1, o.steps - 1);
  for (int64_t step = start_step; step < o.steps; ++step) {
    std::optional<StepTrace> trace;
    if (step == traced) st.step->set_trace(&trace.emplace());
    auto t0 = Clock::now();
    double lr = lr_at(step, o.warmup, o.steps, o.lr, o.lr * o.min_lr_frac);
    double loss = 0;
    bool measure = steps_this_run == 0;
    // Without stages, one micro-batch per call; a pipeline takes the step's at once.
    const int64_t per_call = st.micro_batches_per_call();
    for (int64_t micro = 0; micro < o.grad_accum; micro += per_call) {
      batch.clear();
      for (int64_t j = 0; j < per_call; ++j) train.next(&batch);
      if (measure && micro == 0) st.paint_arena();
      if (world) maybe_kill(world->rank(), step);
      TS_ASSIGN_OR_RETURN(float l, st.forward_backward(feed_of(batch)));
      loss += l * static_cast<double>(per_call);
      if (measure && micro == 0) report_arena(st, world);
    }
    loss /= static_cast<double>(o.grad_accum);
    TS_ASSIGN_OR_RETURN(double norm, st.apply(lr, o.clip));
    if (trace) {
      st.step->set_trace(nullptr);
      TS_RETURN_IF_ERROR(write_trace(o, world, st, *trace, step));
    }
    // The previous step's checkpoint, written during this step, is published now.
    TS_RETURN_IF_ERROR(publish_checkpoint());
    const bool skipped = st.step_skipped();  // fp16: the gradients overflowed, no update
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (steps_this_run == 0) first_step_secs = dt;
    ++steps_this_run;
    step_secs += dt;
    nlohmann::json rec = {{"step", step},
                          {"loss", loss},
                          {"lr", lr},
                          {"grad_norm", norm},
                          {rate_key, tokens_per_step / dt},
                          {"flops_per_s_per_rank", model_flops_per_step / dt / ranks},
                          {"mfu", model_flops_per_step / dt / ranks / peak},
                          {"peak_flops_per_rank", peak},
                          {"step_s", dt}};
    if (st.loss_scale() > 0) rec["loss_scale"] = st.loss_scale();
    if (mfu.measured > 0) rec["gemm_flops_per_rank"] = mfu.measured;  // beside a datasheet's
    // A mixture of experts: the (token, expert) routes of the step that found no slot.
    for (const auto& [name, sum] : st.step->take_metrics())
      if (name == kMoeKeptMetric) {
        const double routes =
            static_cast<double>(st.model.moe_routes) * static_cast<double>(o.grad_accum);
        rec["moe_routes"] = routes;
        rec["moe_dropped_routes"] = std::round(routes - sum);
      }
    if (skipped) {
      rec["grad_norm"] = nullptr;
      rec["skipped"] = true;
    }
    if (leader) {
      metrics << rec.dump() << "\n";
      metrics.flush();
      progress.update(step + 1, loss, tokens_per_step / dt);
    }

    // The loss and norm are the same on every rank (all-reduced), so all stop together.
    if (!std::isfinite(loss) || !std::isfinite(norm))
      return diverged(step, std::isfinite(loss) ? "gradient norm" : "loss", last_saved, o);
    if (skipped && st.loss_scale() < 1)  // halved from 2^16 on every step since: not overflow
      return diverged(step, "fp16 gradients (at every loss scale down to 1)", last_saved, o);
    const bool last = step + 1 == o.steps;
    if ((o.eval_every > 0 && (step + 1) % o.eval_every == 0) || last) {
      TS_ASSIGN_OR_RETURN(double vl, evaluate(st, val, o.eval_batches));
      nlohmann::json rec = {{"step", step}, {"val_loss", vl}};
      std::string note = "step " + std::to_string(step + 1) + ": val loss " + std::to_string(vl);
      if (data.val_whole) {
        // Rank 0 ranks the classes of the same validation batches on the gathered parameters.
        std::vector<std::vector<float>> whole;
        TS_RETURN_IF_ERROR(st.gather_params(&whole));
        if (leader) {
          TS_RETURN_IF_ERROR(data.val_whole->restore(whole_start));
          const double acc = st.accuracy(whole, *data.val_whole, o.eval_batches);
          rec["val_accuracy"] = acc;
          note += ", accuracy " + std::to_string(acc);
        }
      }
      if (leader) {
        metrics << rec.dump() << "\n";
        metrics.flush();
        progress.note(note);
      }
    }
    // A stop signal on any rank stops every rank after this step (its evaluation included:
    // a signal during a long evaluation stops here, not a step later), with a checkpoint.
    int signal = pending_stop_signal();
    if (world) {
      TS_ASSIGN_OR_RETURN(double s, world->all_reduce_scalar(signal, /*max=*/true, "stop signal"));
      signal = static_cast<int>(s);
    }
    const bool stopping = (o.stop_after > 0 && steps_this_run >= o.stop_after) || signal != 0;
    if ((o.ckpt_every > 0 && (step + 1) % o.ckpt_every == 0) || last || stopping) {
      // An update can overflow the parameters with a finite loss: never save those.
      TS_ASSIGN_OR_RETURN(bool finite, st.params_finite());
      if (!finite) return diverged(step, "parameters after the update", last_saved, o);
      TS_RETURN_IF_ERROR(st.begin_save(o.out + "/checkpoints", step + 1, train));
      // Its files are written during the next step; the run's last (or stopping) step waits.
      if (last || stopping) TS_RETURN_IF_ERROR(publish_checkpoint());
    }
    if (signal != 0) {
      if (leader) {
        progress.finish();
        std::fprintf(stderr,
                     "stopped by %s after step %lld, checkpoint saved; continue with the same "
                     "command and --resume\n",
                     signal == SIGINT ? "SIGINT" : "SIGTERM", (long long)(step + 1));
      }
      std::fflush(nullptr);
      std::exit(128 + signal);
    }
    if (stopping) break;
  }
  if (leader) progress.finish();
  double secs = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (leader && steps_this_run > 0) {
    // The steady rate: the steps after this run's first (which starts the libraries and
    // records the step's graph), or that one alone.
    const bool steady = steps_this_run > 1;
    const double steps = static_cast<double>(steps_this_run - (steady ? 1 : 0));
    const double secs_of = steady ? step_secs - first_step_secs : step_secs;
    const double per_rank = model_flops_per_step * steps / secs_of / static_cast<double>(ranks);
    const std::string over = steady ? "first step " + format_duration(first_step_secs) +
                                          "; steps " + std::to_string(start_step + 2) + "-" +
                                          std::to_string(start_step + steps_this_run) + ": "
                                    : std::string();
    std::fprintf(
        stderr,
        "trained %lld step%s in %s (%s in steps): %s%s %s/s, %s FLOP/s per rank, MFU "
        "%.1f%% of %s FLOP/s (%s)%s\n",
        (long long)steps_this_run, steps_this_run == 1 ? "" : "s", format_duration(secs).c_str(),
        format_duration(step_secs).c_str(), over.c_str(),
        format_si(tokens_per_step * steps / secs_of).c_str(), images ? "images" : "tokens",
        format_si(per_rank).c_str(), 100 * per_rank / peak, format_si(peak).c_str(),
        mfu.source.c_str(),
        mfu.source == "this rank's measured GEMM rate" || mfu.measured <= 0
            ? ""
            : ("; this rank's measured GEMM rate " + format_si(mfu.measured) + " FLOP/s").c_str());
    if (per_rank > peak)
      std::fprintf(stderr,
                   "note: an MFU above 100%%: the peak (%s FLOP/s) is below the rate this rank "
                   "reached; give the device's datasheet peak with --peak-flops\n",
                   format_si(peak).c_str());
  }

  report_resident_memory(st, at_start, world);  // before the sample gathers the parameters
  if (o.sample_tokens > 0 && task_of(cfg) == ModelTask::language_model &&
      start_step + steps_this_run == o.steps) {
    // Every rank takes part in gathering the whole parameters; rank 0 samples.
    std::vector<std::vector<float>> whole;
    TS_RETURN_IF_ERROR(st.gather_params(&whole));
    std::vector<int32_t> prompt = data.tok->encode("The whale");
    const bool fits =
        std::all_of(prompt.begin(), prompt.end(), [&](int32_t id) { return id < cfg.vocab_size; });
    if (leader && !fits)
      std::fprintf(stderr,
                   "note: no sample: the prompt's tokens (%s) lie beyond the model's "
                   "vocabulary of %lld; tokenize the data with the model's tokenizer "
                   "(tessera tokenize --tokenizer) or pass --sample-tokens 0\n",
                   data.tok->name().c_str(), static_cast<long long>(cfg.vocab_size));
    if (leader && fits) {
      TS_ASSIGN_OR_RETURN(
          std::string text,
          st.sample(whole, prompt, static_cast<int>(o.sample_tokens), o.seed, *data.tok));
      std::printf("--- sample ---\n%s\n--------------\n", text.c_str());
    }
  }
  return Status();
}

}  // namespace tessera
