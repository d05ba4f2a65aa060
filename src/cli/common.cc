#include "cli/common.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>

#include "base/check.h"
#if TESSERA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#if TESSERA_HAVE_NCCL
#include "comm/nccl_comm.h"
#endif
#endif
#include "cli/commands.h"
#include "comm/mpi_comm.h"

namespace tessera {

std::string default_data_dir() {
  if (const char* env = std::getenv("TESSERA_DATA_DIR")) return env;
  return TESSERA_DEFAULT_DATA_DIR;
}

int run_captured(const std::string& command, std::string* out) {
  out->clear();
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-.,/:=+@") == std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

void exit_on_error(const Status& s) {
  if (s.ok()) return;
  if (s.reported()) std::exit(1);  // another rank printed it
  std::fprintf(stderr, "error: %s\n", s.message().c_str());
  if (!s.hint().empty()) std::fprintf(stderr, "HINT: %s\n", s.hint().c_str());
  std::fflush(stderr);
  std::exit(1);
}

const char* const kCollectivesHelp =
    "How ranks' host collectives run: auto (the faster of the two on this project's "
    "measurement: MPI's all-gathers and small reductions, the ring's large ones), ring (Tessera's "
    "ring over point-to-point sends) or mpi (the MPI library's own, tuned per topology)";

Result<std::unique_ptr<Communicator>> join_mpi_job(const std::string& collectives) {
  const std::optional<CollectiveAlgo> algo = parse_collective_algo(collectives);
  if (!algo)
    return error("--collectives '" + collectives + "' is not a choice",
                 "use --collectives auto, ring or mpi");
  if (!launched_by_mpirun()) return std::unique_ptr<Communicator>();
  TS_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, mpi_world(nullptr, nullptr, *algo));
  install_termination_reporter();
  set_process_rank(world->rank());
  return world;
}

Status check_device(const std::string& device) {
  if (device == "cpu") return Status();
  if (device != "cuda")
    return error("--device '" + device + "' is not a device", "use --device cpu or --device cuda");
#if TESSERA_HAVE_CUDA
  std::string why;
  if (!cuda_device_present(&why))
    return error("--device cuda: " + why,
                 "run on a machine with an NVIDIA GPU (sm_80 or newer), or use --device cpu");
  return Status();
#else
  return error("--device cuda: this tessera was built without the CUDA backend",
               "build where the CUDA toolkit is installed (scripts/build.sh builds it when "
               "/usr/local/cuda/bin/nvcc exists), or use --device cpu");
#endif
}

namespace {

// This process's rank among the job's ranks on its node, as the launcher tells it (Open MPI's
// mpirun, which `tessera launch` runs; MPICH/Hydra; Slurm); 0 outside a job.
int node_local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(name)) return std::max(0, std::atoi(v));
  return 0;
}

// How many of the job's ranks run on this node, as the launcher tells it; 1 outside a job.
int node_local_size() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(name)) return std::max(1, std::atoi(v));
  return 1;
}

}  // namespace

Result<std::unique_ptr<Communicator>> open_device_comms(Communicator& world, Backend* device) {
  if (device == nullptr || device->memory() != MemSpace::device || world.size() < 2)
    return std::unique_ptr<Communicator>();
#if TESSERA_HAVE_CUDA && TESSERA_HAVE_NCCL
  auto* gpu = dynamic_cast<CudaBackend*>(device);
  TS_CHECK(gpu != nullptr) << "a device backend that is not CUDA";
  // NCCL refuses two ranks on one GPU: every rank must have its own, on every node (decided
  // together, so that all ranks take the same path).
  const bool own_gpu = node_local_size() <= cuda_device_count();
  TS_ASSIGN_OR_RETURN(double shared, world.all_reduce_scalar(own_gpu ? 0 : 1, true, "GPU count"));
  if (shared > 0) {
    if (world.rank() == 0)
      std::fprintf(stderr,
                   "note: more ranks than GPUs on a node: ranks share GPUs, so their collectives "
                   "go through host memory over MPI (NCCL takes one rank per GPU)\n");
    return std::unique_ptr<Communicator>();
  }
  TS_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> nccl, nccl_world(world, gpu->stream()));
  if (world.rank() == 0)
    std::fprintf(stderr,
                 "note: %d ranks on GPUs: the step's collectives run on the GPUs through NCCL; "
                 "parameter syncs, checkpoints' gathers and pipeline messages still go through "
                 "host memory over MPI\n",
                 world.size());
  return nccl;
#else
  if (world.rank() == 0)
    std::fprintf(stderr,
                 "note: this tessera was built without NCCL: the GPU ranks' collectives go "
                 "through host memory over MPI\n");
  return std::unique_ptr<Communicator>();
#endif
}

Result<std::unique_ptr<Backend>> open_device(const std::string& device) {
  TS_RETURN_IF_ERROR(check_device(device));
  if (device == "cpu") return std::unique_ptr<Backend>();
#if TESSERA_HAVE_CUDA
  const int gpus = std::max(1, cuda_device_count());
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(node_local_rank() % gpus));
#else
  return error("unreachable: --device " + device);
#endif
}

std::string device_description(const Backend& b) { return b.device_name(); }

std::string flag_value(const std::vector<std::string>& args, const std::string& name) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind(name + "=", 0) == 0) return args[i].substr(name.size() + 1);
  }
  return "";
}

bool has_flag(const std::vector<std::string>& args, const std::string& name) {
  for (const std::string& a : args)
    if (a == name || a.rfind(name + "=", 0) == 0) return true;
  return false;
}

std::vector<std::string> without_flag(const std::vector<std::string>& args, const std::string& name,
                                      bool takes_value) {
  std::vector<std::string> kept;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name) {
      if (takes_value) ++i;
      continue;
    }
    if (args[i].rfind(name + "=", 0) == 0) continue;
    kept.push_back(args[i]);
  }
  return kept;
}

}  // namespace tessera
