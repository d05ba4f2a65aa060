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

// The windows of T + 1 tokens a shard is cut into (consecutive ones share a token).
int64_t windows_in(const TokenShard& shard, int T) {
  return shard.size() > 0 ? (shard.size() - 1) / T : 0;
}

int64_t windows_in(const std::vector<TokenShard>& shards, int T) {
  int64_t w = 0;
  for (const TokenShard& s : shards) w += windows_in(s, T);
  return w;
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
  std::vector<TokenShard> shards;
  int64_t tokens = 0;
  for (const std::string& p : paths) {
    TS_ASSIGN_OR_RETURN(TokenShard shard, TokenShard::open(p, vocab_size));
    tokens += shard.size();
    shards.push_back(std::move(shard));
  }
  int64_t rows = static_cast<int64_t>(world) * B;
  if (windows_in(shards, T) < rows) {
    return error("token shard '" + path + "' has " + std::to_string(tokens) +
                     " tokens, too few for one global batch of " + shape_text(rows, T) +
                     " (needs " + std::to_string(rows * T + 1) +
                     (shards.size() > 1 ? ", in windows of T + 1 within a shard" : "") + ")",
                 "use a smaller batch size B or sequence length T, or tokenize more text");
  }
  return DataLoader(std::move(shards), B, T, rank, world, seed);
}

DataLoader::DataLoader(std::vector<TokenShard> shards, int B, int T, int rank, int world,
                       uint64_t seed)
    : shards_(std::move(shards)),
      B_(B),
      T_(T),
      num_windows_(windows_in(shards_, T)),
      order_(num_windows_, B, rank, world, seed) {
  int64_t w = 0;
  for (const TokenShard& s : shards_) {
    first_window_.push_back(w);
    w += windows_in(s, T);
  }
}

int64_t DataLoader::num_tokens() const {
  int64_t n = 0;
  for (const TokenShard& s : shards_) n += s.size();
  return n;
}

std::string DataLoader::what() const {
  return shards_[0].path() + (shards_.size() > 1
                                  ? " and " + std::to_string(shards_.size() - 1) + " more shards"
                                  : std::string());
}

void DataLoader::next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets) {
  TS_CHECK(inputs != nullptr && targets != nullptr);
  const size_t n = static_cast<size_t>(B_) * T_;
  inputs->resize(n);
  targets->resize(n);
  std::vector<int32_t> window(static_cast<size_t>(T_) + 1);
  std::vector<int64_t> windows;
  order_.next(&windows);
  for (int b = 0; b < B_; ++b) {
    // The shard holding window w: the last one whose first window is at most w.
    const int64_t w = windows[static_cast<size_t>(b)];
    const size_t s =
        static_cast<size_t>(std::upper_bound(first_window_.begin(), first_window_.end(), w) -
                            first_window_.begin() - 1);
    shards_[s].read((w - first_window_[s]) * T_, T_ + 1, window.data());
    std::copy(window.begin(), window.end() - 1, inputs->begin() + b * T_);
    std::copy(window.begin() + 1, window.end(), targets->begin() + b * T_);
  }
}

void DataLoader::next(HostBatch* batch) {
  next(&x_, &y_);
  // The pieces of each row this rank takes: its chunk, or its two zigzag halves.
  const int64_t len = zigzag_ ? T_ / (2 * chunks_) : T_ / chunks_;
  std::vector<int64_t> firsts = {chunk_ * len};
  if (zigzag_) firsts.push_back((2 * chunks_ - 1 - chunk_) * len);
  for (int b = 0; b < B_; ++b)
    for (int64_t first : firsts) {
      const size_t at = static_cast<size_t>(b * T_ + first);
      batch->append(kTokensInput, x_.data() + at, static_cast<size_t>(len));
      batch->append(kTargetsInput, y_.data() + at, static_cast<size_t>(len));
    }
}

Status DataLoader::set_sequence_chunk(int index, int chunks, bool zigzag) {
  const int pieces = zigzag ? 2 * chunks : chunks;
  if (chunks < 1 || index < 0 || index >= chunks || T_ % pieces != 0)
    return error("sequences of " + std::to_string(T_) + " tokens do not split into " +
                     std::to_string(pieces) + " context-parallel " +
                     (zigzag ? "halves" : "chunks") + " (chunk " + std::to_string(index) + ")",
                 "use a --seq that is a multiple of " + std::to_string(pieces));
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
  const std::string what = "cannot restore the data loader of '" + this->what() + "'";
  const std::string hint =
      "resume with the token file, sequence length, global batch (world*B) and seed of the "
      "run that saved the checkpoint";
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
