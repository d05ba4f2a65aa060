#include "data/loader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/check.h"
#include "models/model.h"

namespace tessera {
namespace {

std::string shape_text(int64_t rows, int64_t T) {
  return std::to_string(rows) + " rows x " + std::to_string(T) + " tokens";
}

// The shards manifest.json (tokenize_to_shards) lists, each checked to be there with the
// size the manifest gives.
Result<ShardFiles> shards_of_manifest(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(dir) / "manifest.json";
  const std::string hint = "re-run `tessera tokenize` into a fresh --out";
  nlohmann::json m;
  try {
    std::ifstream in(path);
    m = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return error("data manifest '" + path.string() + "' is not valid JSON (" + e.what() + ")",
                 hint);
  }
  ShardFiles f;
  for (const char* split : {"train", "val"}) {
    if (!m.contains(split) || !m[split].is_array() || m[split].empty())
      return error("data manifest '" + path.string() + "' lists no " + split + " shards", hint);
    for (const nlohmann::json& e : m[split]) {
      if (!e.is_object() || !e.contains("file") || !e["file"].is_string() || !e.contains("bytes") ||
          !e["bytes"].is_number_integer())
        return error("data manifest '" + path.string() + "': " + split + " entry " + e.dump() +
                         " is not {\"file\": NAME, \"bytes\": N, ...}",
                     hint);
      const fs::path shard = fs::path(dir) / e["file"].get<std::string>();
      std::error_code ec;
      const auto size = fs::file_size(shard, ec);
      if (ec)
        return error("data directory '" + dir + "': manifest.json lists " + shard.string() +
                         ", which is missing (" + ec.message() + ")",
                     hint);
      if (static_cast<int64_t>(size) != e["bytes"].get<int64_t>())
        return error("data directory '" + dir + "': " + shard.string() + " has " +
                         std::to_string(size) + " bytes, manifest.json says " +
                         std::to_string(e["bytes"].get<int64_t>()) + " (truncated or replaced?)",
                     hint);
      (std::string(split) == "train" ? f.train : f.val).push_back(shard.string());
    }
  }
  return f;
}

}  // namespace

Result<ShardFiles> find_token_shards(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path d(dir);
  if (fs::exists(d / "manifest.json")) return shards_of_manifest(dir);
  if (fs::exists(d / "train.bin") && fs::exists(d / "val.bin"))
    return ShardFiles{{(d / "train.bin").string()}, {(d / "val.bin").string()}};
  ShardFiles f;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(d, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || e.path().extension() != ".bin") continue;
    if (name.find("train") != std::string::npos)
      f.train.push_back(e.path().string());
    else if (name.find("val") != std::string::npos)
      f.val.push_back(e.path().string());
  }
  if (ec) return error("cannot list data directory '" + dir + "': " + ec.message());
  std::sort(f.train.begin(), f.train.end());
  std::sort(f.val.begin(), f.val.end());
  if (f.train.empty() || f.val.empty())
    return error("data directory '" + dir +
                     "' has neither train.bin and val.bin nor .bin shards "
                     "named train and val (found " +
                     std::to_string(f.train.size()) + " train and " + std::to_string(f.val.size()) +
                     " val shards)",
                 "create them with `tessera tokenize --input TEXT --out " + dir +
                     "`, or point --data at a folder of llm.c shards (fineweb_train_*.bin, "
                     "fineweb_val_*.bin)");
  return f;
}

Result<DataLoader> DataLoader::open(const std::string& path, int vocab_size, int B, int T, int rank,
                                    int world, uint64_t seed) {
  return open(std::vector<std::string>{path}, vocab_size, B, T, rank, world, seed);
}

Result<DataLoader> DataLoader::open(const std::vector<std::string>& paths, int vocab_size, int B,
                                    int T, int rank, int world, uint64_t seed) {
  const std::string path =
      paths.empty()
          ? std::string("(no shards)")
          : paths[0] + (paths.size() > 1 ? " and " + std::to_string(paths.size() - 1) + " more"
                                         : std::string());
  if (B < 1 || T < 1) {
    return error("data loader for '" + path + "': batch B=" + std::to_string(B) +
                     " and sequence length T=" + std::to_string(T) + " must both be >= 1",
                 "set a positive batch size and sequence length in the config");
  }
  if (world < 1 || rank < 0 || rank >= world) {
    return error("data loader for '" + path + "': rank " + std::to_string(rank) +
                     " is not in a world of " + std::to_string(world) + " ranks",
                 "rank must be in [0, world)");
  }
  if (paths.empty()) return error("data loader: no token shards given");
  TS_ASSIGN_OR_RETURN(TokenWindows windows, TokenWindows::open(paths, vocab_size, T));
  int64_t rows = static_cast<int64_t>(world) * B;
  if (windows.size() < rows) {
    return error("token shard '" + path + "' has " + std::to_string(windows.num_tokens()) +
                     " tokens, too few for one global batch of " + shape_text(rows, T) +
                     " (needs " + std::to_string(rows * T + 1) +
                     (paths.size() > 1 ? ", in windows of T + 1 within a shard" : "") + ")",
                 "use a smaller batch size B or sequence length T, or tokenize more text");
  }
  return DataLoader(std::move(windows), B, T, rank, world, seed);
}

DataLoader::DataLoader(TokenWindows windows, int B, int T, int rank, int world, uint64_t seed)
    : windows_(std::move(windows)), B_(B), T_(T), order_(windows_.size(), B, rank, world, seed) {}

int64_t DataLoader::num_tokens() const { return windows_.num_tokens(); }

void DataLoader::next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets) {
  TS_CHECK(inputs != nullptr && targets != nullptr);
  const size_t n = static_cast<size_t>(B_) * T_;
  inputs->resize(n);
  targets->resize(n);
  std::vector<int32_t> window(static_cast<size_t>(T_) + 1);
  std::vector<int64_t> windows;
  order_.next(&windows);
  for (int b = 0; b < B_; ++b) {
    windows_.read(windows[static_cast<size_t>(b)], window.data());
    std::copy(window.begin(), window.end() - 1, inputs->begin() + b * T_);
    std::copy(window.begin() + 1, window.end(), targets->begin() + b * T_);
  }
}

void DataLoader::next(HostBatch* batch) {
  next(&x_, &y_);
  append_sequence_chunks(x_, y_, B_, T_, chunk_, chunks_, zigzag_, batch);
}

Status DataLoader::set_sequence_chunk(int index, int chunks, bool zigzag) {
  TS_RETURN_IF_ERROR(check_sequence_chunk(T_, index, chunks, zigzag));
  chunk_ = index;
  chunks_ = chunks;
  zigzag_ = zigzag;
  return Status();
}

LoaderState DataLoader::state() const {
  LoaderState s;
  order_.fill(&s);
  s.seq_len = T_;
  s.num_tokens = num_tokens();
  return s;
}

Status DataLoader::restore(const LoaderState& s) {
  const std::string what = "cannot restore the data loader of '" + windows_.what() + "'";
  const std::string hint =
      "resume with the token file, sequence length, global batch (world*B) and seed of the "
      "run that saved the checkpoint";
  if (!s.mixture.empty())
    return error(what +
                     ": the saved state is of a mixture of folders (--data A=W,B=W), this "
                     "run reads one folder",
                 hint);
  if (s.num_tokens != num_tokens()) {
    return error(what + ": the saved state is for a file of " + std::to_string(s.num_tokens) +
                     " tokens, this one has " + std::to_string(num_tokens()) +
                     " (re-tokenized or a different file?)",
                 hint);
  }
  const int64_t rows = order_.global_rows();
  if (s.seq_len != T_ || s.global_rows != rows) {
    return error(what + ": the saved state is for global batches of " +
                     shape_text(s.global_rows, s.seq_len) + ", this loader makes " +
                     shape_text(rows, T_),
                 hint);
  }
  return order_.restore(s, what, hint);
}

}  // namespace tessera
