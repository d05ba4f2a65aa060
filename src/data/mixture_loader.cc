#include "data/mixture_loader.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "base/check.h"

namespace tessera {

bool is_mixture_spec(const std::string& data) {
  std::error_code ec;  // a folder whose path holds a '=' (dt=2024-01-01/) is one folder
  return data.find('=') != std::string::npos && !std::filesystem::is_directory(data, ec);
}

Result<MixtureSpec> parse_mixture_spec(const std::string& data) {
  const std::string hint =
      "write the mixture as FOLDER=WEIGHT,FOLDER=WEIGHT (e.g. "
      "--data web=0.7,code=0.3), each folder tokenized by `tessera tokenize`";
  MixtureSpec spec;
  double total = 0;
  size_t start = 0;
  while (start <= data.size()) {
    size_t end = data.find(',', start);
    if (end == std::string::npos) end = data.size();
    const std::string part = data.substr(start, end - start);
    const size_t eq = part.rfind('=');
    if (eq == std::string::npos || eq == 0)
      return error("--data mixture part '" + part + "' is not FOLDER=WEIGHT", hint);
    const std::string w = part.substr(eq + 1);
    char* stop = nullptr;
    const double weight = std::strtod(w.c_str(), &stop);
    if (w.empty() || *stop != '\0' || !(weight > 0) || !std::isfinite(weight))
      return error("--data mixture weight '" + w + "' of " + part.substr(0, eq) +
                       " is not a positive number",
                   hint);
    spec.dirs.push_back(part.substr(0, eq));
    spec.weights.push_back(weight);
    total += weight;
    start = end + 1;
  }
  for (double& w : spec.weights) w /= total;
  return spec;
}

Result<MixtureLoader> MixtureLoader::open(const std::vector<std::vector<std::string>>& shards,
                                          const std::vector<double>& weights, int vocab_size, int B,
                                          int T, int rank, int world, uint64_t seed) {
  if (B < 1 || T < 1 || world < 1 || rank < 0 || rank >= world)
    return error("mixture loader: batch B=" + std::to_string(B) +
                 ", sequence length T=" + std::to_string(T) + ", rank " + std::to_string(rank) +
                 " of " + std::to_string(world) + " are out of range");
  if (shards.empty() || shards.size() != weights.size() || shards.size() > 255)
    return error("a data mixture takes 1 to 255 sources, each with a weight");
  MixtureLoader m;
  m.B_ = B, m.T_ = T, m.rank_ = rank, m.world_ = world, m.seed_ = seed;
  // Slots per period: largest remainders of weight x kPeriod.
  double total = 0;
  for (double w : weights) total += w;
  std::vector<std::pair<double, size_t>> remainders;
  int given = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    if (!(weights[s] > 0))
      return error("data mixture weight " + std::to_string(weights[s]) + " is not positive");
    const double exact = weights[s] / total * kPeriod;
    Source src;
    src.slots = static_cast<int32_t>(std::floor(exact));
    given += src.slots;
    remainders.emplace_back(-(exact - src.slots), s);
    TS_ASSIGN_OR_RETURN(src.windows, TokenWindows::open(shards[s], vocab_size, T));
    if (src.windows.size() < 1)
      return error("data mixture source '" + src.windows.what() + "' has " +
                       std::to_string(src.windows.num_tokens()) +
                       " tokens, fewer than one row of " + std::to_string(T + 1),
                   "tokenize more text into it, or drop it from the mixture");
    src.seed = seed == 0 ? 0 : seed ^ (0x9E3779B97F4A7C15ull * (s + 1));
    m.sources_.push_back(std::move(src));
  }
  std::sort(remainders.begin(), remainders.end());
  for (size_t i = 0; given < kPeriod; ++i, ++given) ++m.sources_[remainders[i].second].slots;
  for (size_t s = 0; s < m.sources_.size(); ++s)
    if (m.sources_[s].slots == 0)
      return error("data mixture weight of '" + m.sources_[s].windows.what() + "' (" +
                       std::to_string(weights[s] / total) + ") is below one row in " +
                       std::to_string(kPeriod),
                   "give it a weight of at least 1/" + std::to_string(kPeriod) + " of the total");
  // Smooth weighted round robin: each slot goes to the source furthest behind its share.
  std::vector<int64_t> current(m.sources_.size(), 0);
  m.schedule_.resize(kPeriod);
  for (Source& src : m.sources_) src.before.assign(kPeriod + 1, 0);
  for (int k = 0; k < kPeriod; ++k) {
    size_t pick = 0;
    for (size_t s = 0; s < m.sources_.size(); ++s) {
      current[s] += m.sources_[s].slots;
      if (current[s] > current[pick]) pick = s;
    }
    current[pick] -= kPeriod;
    m.schedule_[static_cast<size_t>(k)] = static_cast<uint8_t>(pick);
    for (size_t s = 0; s < m.sources_.size(); ++s)
      m.sources_[s].before[static_cast<size_t>(k) + 1] =
          m.sources_[s].before[static_cast<size_t>(k)] + (s == pick ? 1 : 0);
  }
  return m;
}

int64_t MixtureLoader::window_of(Source& src, int64_t c) {
  const int64_t windows = src.windows.size();
  const int64_t pass = c / windows, i = c % windows;
  if (src.seed == 0) return i;
  if (pass != src.pass) {
    src.order = shuffled_order(windows, src.seed, static_cast<uint64_t>(pass));
    src.pass = pass;
  }
  return src.order[static_cast<size_t>(i)];
}

void MixtureLoader::next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets) {
  const size_t n = static_cast<size_t>(B_) * T_;
  inputs->resize(n);
  targets->resize(n);
  window_.resize(static_cast<size_t>(T_) + 1);
  const int64_t first = batches_ * world_ * B_ + int64_t{rank_} * B_;
  for (int b = 0; b < B_; ++b) {
    const int64_t row = first + b;
    const int64_t k = row % kPeriod;
    Source& src = sources_[schedule_[static_cast<size_t>(k)]];
    const int64_t c = row / kPeriod * src.slots + src.before[static_cast<size_t>(k)];
    src.windows.read(window_of(src, c), window_.data());
    std::copy(window_.begin(), window_.end() - 1, inputs->begin() + int64_t{b} * T_);
    std::copy(window_.begin() + 1, window_.end(), targets->begin() + int64_t{b} * T_);
  }
  ++batches_;
}

void MixtureLoader::next(HostBatch* batch) {
  next(&x_, &y_);
  append_sequence_chunks(x_, y_, B_, T_, chunk_, chunks_, zigzag_, batch);
}

Status MixtureLoader::set_sequence_chunk(int index, int chunks, bool zigzag) {
  TS_RETURN_IF_ERROR(check_sequence_chunk(T_, index, chunks, zigzag));
  chunk_ = index, chunks_ = chunks, zigzag_ = zigzag;
  return Status();
}

int64_t MixtureLoader::num_tokens() const {
  int64_t n = 0;
  for (const Source& s : sources_) n += s.windows.num_tokens();
  return n;
}

std::string MixtureLoader::signature() const {
  std::string sig;
  for (const Source& s : sources_)
    sig += (sig.empty() ? "" : ",") + std::to_string(s.windows.num_tokens()) + ":" +
           std::to_string(s.slots);
  return sig;
}

LoaderState MixtureLoader::state() const {
  LoaderState s;
  s.epoch = 0;
  s.position = static_cast<uint64_t>(batches_);
  s.seed = seed_;
  s.global_rows = int64_t{world_} * B_;
  s.seq_len = T_;
  s.num_tokens = num_tokens();
  s.mixture = signature();
  return s;
}

Status MixtureLoader::restore(const LoaderState& s) {
  const std::string what = "cannot restore the data mixture of " + std::to_string(sources_.size()) +
                           " folders (" + signature() + " tokens:slots)";
  const std::string hint =
      "resume with the folders, weights, sequence length, global batch (world*B) and seed of "
      "the run that saved the checkpoint";
  if (s.mixture.empty())
    return error(what + ": the saved state is of one folder, not a mixture", hint);
  if (s.mixture != signature())
    return error(what + ": the saved state is of the mixture " + s.mixture, hint);
  if (s.seq_len != T_ || s.global_rows != int64_t{world_} * B_ || s.seed != seed_)
    return error(what + ": the saved state is for global batches of " +
                     std::to_string(s.global_rows) + " rows x " + std::to_string(s.seq_len) +
                     " tokens with seed " + std::to_string(s.seed),
                 hint);
  batches_ = static_cast<int64_t>(s.position);
  return Status();
}

}  // namespace tessera
