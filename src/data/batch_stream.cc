#include "data/batch_stream.h"

#include <nlohmann/json.hpp>
#include <numeric>

#include "base/check.h"

namespace tessera {

void to_json(nlohmann::json& j, const LoaderState& s) {
  j = nlohmann::json{{"epoch", s.epoch},     {"position", s.position},
                     {"seed", s.seed},       {"global_rows", s.global_rows},
                     {"seq_len", s.seq_len}, {"num_tokens", s.num_tokens}};
  if (!s.mixture.empty()) j["mixture"] = s.mixture;
}

void from_json(const nlohmann::json& j, LoaderState& s) {
  j.at("epoch").get_to(s.epoch);
  j.at("position").get_to(s.position);
  j.at("seed").get_to(s.seed);
  j.at("global_rows").get_to(s.global_rows);
  j.at("seq_len").get_to(s.seq_len);
  j.at("num_tokens").get_to(s.num_tokens);
  s.mixture = j.contains("mixture") ? j.at("mixture").get<std::string>() : "";
}

Result<LoaderState> loader_state_from_json(const nlohmann::json& j) {
  try {
    return j.get<LoaderState>();
  } catch (const nlohmann::json::exception& e) {
    return error(std::string("data loader state ") + j.dump() + " is malformed: " + e.what(),
                 "the checkpoint's \"loader\" entry must hold epoch, position, seed, "
                 "global_rows, seq_len and num_tokens as written by the loader's state()");
  }
}

std::vector<uint8_t>& HostBatch::buffer(const std::string& name) {
  for (auto& [n, b] : inputs)
    if (n == name) return b;
  inputs.emplace_back(name, std::vector<uint8_t>());
  return inputs.back().second;
}

void HostBatch::clear() {
  for (auto& in : inputs) in.second.clear();
}

ExampleOrder::ExampleOrder(int64_t examples, int B, int rank, int world, uint64_t seed)
    : examples_(examples), B_(B), rank_(rank), world_(world), seed_(seed) {
  batches_per_epoch_ = examples_ / global_rows();
  TS_CHECK_GE(batches_per_epoch_, 1);
  start_epoch(0);
}

void ExampleOrder::start_epoch(uint64_t epoch) {
  epoch_ = epoch;
  position_ = 0;
  if (seed_ == 0) {
    order_.clear();
    return;
  }
  order_ = shuffled_order(examples_, seed_, epoch);
}

std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, uint64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  // The stream depends only on (seed, epoch): mix them so nearby seeds/epochs differ.
  SplitMix64 rng(SplitMix64(seed).next() ^ (epoch * 0xD1B54A32D192ED03ull + 1));
  for (size_t i = order.size(); i > 1; --i) {
    size_t j = static_cast<size_t>(rng.below(i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

void ExampleOrder::next(std::vector<int64_t>* examples) {
  examples->resize(static_cast<size_t>(B_));
  const int64_t first =
      static_cast<int64_t>(position_) * global_rows() + static_cast<int64_t>(rank_) * B_;
  for (int b = 0; b < B_; ++b)
    (*examples)[static_cast<size_t>(b)] =
        order_.empty() ? first + b : order_[static_cast<size_t>(first + b)];
  if (++position_ == static_cast<uint64_t>(batches_per_epoch_)) start_epoch(epoch_ + 1);
}

void ExampleOrder::fill(LoaderState* s) const {
  s->epoch = epoch_;
  s->position = position_;
  s->seed = seed_;
  s->global_rows = global_rows();
}

Status ExampleOrder::restore(const LoaderState& s, const std::string& what,
                             const std::string& hint) {
  if (s.global_rows != global_rows()) {
    return error(what + ": the saved state is for global batches of " +
                     std::to_string(s.global_rows) + " rows, this loader makes " +
                     std::to_string(global_rows()),
                 hint);
  }
  if (s.seed != seed_) {
    return error(what + ": the saved state is for seed " + std::to_string(s.seed) +
                     ", this loader has seed " + std::to_string(seed_),
                 hint);
  }
  if (s.position >= static_cast<uint64_t>(batches_per_epoch_)) {
    return error(what + ": saved position " + std::to_string(s.position) +
                     " is past the end of an epoch of " + std::to_string(batches_per_epoch_) +
                     " batches",
                 "the checkpoint's loader state is corrupt; " + hint);
  }
  if (s.epoch != epoch_) start_epoch(s.epoch);
  position_ = s.position;
  return Status();
}

}  // namespace tessera
