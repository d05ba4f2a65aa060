// What a training run reads its data through: a stream of micro-batches, each one host buffer
// per model input (by name: a language model's tokens and targets, an image classifier's
// images and labels), split across data-parallel ranks and resumable from a small saved state.
//
//   std::unique_ptr<BatchStream> train = ...;  // DataLoader (tokens), ImageLoader (images)
//   HostBatch batch;
//   train->next(&batch);                       // this rank's rows of the next micro-batch
//   nlohmann::json saved = train->state();     // into the checkpoint
//
// ExampleOrder is the order both loaders share: a dataset of E examples (token windows,
// images) read world*B per global batch, rank r taking rows [r*B, (r+1)*B), so N ranks with
// batch B see exactly the batches of one rank with batch N*B. An epoch is E / (world*B) global
// batches (the remainder is skipped that epoch). seed == 0 reads examples in file order; seed
// != 0 shuffles them per epoch with a permutation derived only from (seed, epoch), so every
// rank computes the same one and a restored run continues identically.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace tessera {

// SplitMix64: a tiny generator whose output is fixed by its seed on every platform (the
// standard distributions are not), so shuffles are reproducible anywhere.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), without modulo bias.
  uint64_t below(uint64_t n) {
    uint64_t threshold = (0 - n) % n;
    for (;;) {
      uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }

 private:
  uint64_t state_;
};

// Where a loader is; small, and saved with checkpoints. The fields after `position` record
// the run it belongs to, so restore() can refuse a state from another file or batch shape.
struct LoaderState {
  uint64_t epoch = 0;       // completed passes over the data
  uint64_t position = 0;    // global batches already taken in this epoch
  uint64_t seed = 0;        // 0: file order
  int64_t global_rows = 0;  // world * B
  int64_t seq_len = 0;      // tokens: T; images: values per image
  int64_t num_tokens = 0;   // tokens: tokens in the shard; images: images in the set
  // A mixture of folders (MixtureLoader): each source's tokens and slots per period, e.g.
  // "1000000:7000,500000:3000"; empty for one folder. position then counts global batches
  // since the start (epoch 0).
  std::string mixture;
  bool operator==(const LoaderState&) const = default;
};

// nlohmann::json conversions: {"epoch": .., "position": .., "seed": .., "global_rows": ..,
// "seq_len": .., "num_tokens": ..[, "mixture": ..]}. from_json throws nlohmann::json::exception on
// a missing or mistyped key; loader_state_from_json returns an error instead.
void to_json(nlohmann::json& j, const LoaderState& state);
void from_json(const nlohmann::json& j, LoaderState& state);
Result<LoaderState> loader_state_from_json(const nlohmann::json& j);

// One micro-batch on the host: a byte buffer per model input, in the order first added.
struct HostBatch {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> inputs;
  // The buffer of `name` (added, empty, when missing).
  std::vector<uint8_t>& buffer(const std::string& name);
  // Appends `n` values of type T to the buffer of `name`.
  template <typename T>
  void append(const std::string& name, const T* values, size_t n) {
    std::vector<uint8_t>& b = buffer(name);
    const auto* p = reinterpret_cast<const uint8_t*>(values);
    b.insert(b.end(), p, p + n * sizeof(T));
  }
  void clear();  // empties every buffer
};

class BatchStream {
 public:
  virtual ~BatchStream() = default;
  // Appends this rank's rows of the next global micro-batch to `batch` and advances.
  virtual void next(HostBatch* batch) = 0;
  virtual LoaderState state() const = 0;
  // Continues from `state`, which must come from a stream over the same data with the same
  // global batch and seed (world itself may differ); fails otherwise, or when its position is
  // past the end of an epoch, leaving this stream unchanged.
  virtual Status restore(const LoaderState& state) = 0;
};

// The order of `n` examples in pass `epoch`: a permutation that depends only on (seed, epoch).
std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, uint64_t epoch);

class ExampleOrder {
 public:
  // `examples` >= world * B.
  ExampleOrder(int64_t examples, int B, int rank, int world, uint64_t seed);
  // The examples of this rank's B rows of the next global batch, and advances.
  void next(std::vector<int64_t>* examples);
  // epoch, position, seed and global_rows of `state`.
  void fill(LoaderState* state) const;
  // Takes epoch and position from `state` after checking its seed, global rows and position;
  // errors start with `what` and end with `hint`.
  Status restore(const LoaderState& state, const std::string& what, const std::string& hint);
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t global_rows() const { return static_cast<int64_t>(world_) * B_; }

 private:
  void start_epoch(uint64_t epoch);  // builds order_ for `epoch`

  int64_t examples_;
  int B_, rank_, world_;
  uint64_t seed_;
  int64_t batches_per_epoch_;
  uint64_t epoch_ = 0, position_ = 0;
  std::vector<int64_t> order_;  // this epoch's example order; empty if seed 0
};

}  // namespace tessera
