// A weighted mixture of token folders: `train --data web=0.7,code=0.3` reads 70% of its rows
// from web/'s shards and 30% from code/'s, deterministically and resumably.
//
//   TS_ASSIGN_OR_RETURN(MixtureSpec spec, parse_mixture_spec("web=0.7,code=0.3"));
//   TS_ASSIGN_OR_RETURN(MixtureLoader train,
//                       MixtureLoader::open({web.train, code.train}, spec.weights, vocab,
//                                           B, T, rank, world, seed));
//   train.next(&x, &y);  // as DataLoader::next
//
// Rows: global row n (of all global batches, world*B per batch, rank r taking rows [r*B,
// (r+1)*B) of each, as DataLoader) comes from the source that slot n % kPeriod of a fixed
// schedule names. The schedule gives source s round(w_s * kPeriod) slots (largest remainders;
// at least one each), spread by smooth weighted round robin, so every prefix of rows holds
// each source's share within a row or two of its weight. A source's rows are its windows
// (token_windows.h), in file order when seed == 0, else shuffled per pass over that source
// by (seed, source, pass) alone; a small source simply starts its next pass sooner. The state
// is the count of global batches taken, so N ranks see the batches of one rank and a resumed
// run continues exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "data/batch_stream.h"
#include "data/token_windows.h"

namespace tessera {

struct MixtureSpec {
  std::vector<std::string> dirs;
  std::vector<double> weights;  // normalized to sum to 1
};

// Whether a --data value is a mixture ("PATH=WEIGHT,..."): it holds a '=' and is not itself a
// folder.
bool is_mixture_spec(const std::string& data);
// Parses "PATH=WEIGHT,PATH=WEIGHT,..."; errors name the part that is not PATH=WEIGHT or whose
// weight is not a positive number.
Result<MixtureSpec> parse_mixture_spec(const std::string& data);

class MixtureLoader : public BatchStream {
 public:
  static constexpr int kPeriod = 10000;

  // `shards[s]`: source s's shard files. Fails when a weight is not positive or too small
  // for one slot in kPeriod, a source has no window of T + 1 tokens, or B, T, rank, world are
  // out of range.
  static Result<MixtureLoader> open(const std::vector<std::vector<std::string>>& shards,
                                    const std::vector<double>& weights, int vocab_size, int B,
                                    int T, int rank = 0, int world = 1, uint64_t seed = 0);

  void next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets);
  void next(HostBatch* batch) override;
  Status set_sequence_chunk(int index, int chunks, bool zigzag = false);
  LoaderState state() const override;
  Status restore(const LoaderState& state) override;

  // The source global row n comes from.
  int source_of_row(int64_t n) const { return schedule_[static_cast<size_t>(n % kPeriod)]; }
  int64_t num_tokens() const;

 private:
  struct Source {
    TokenWindows windows;
    int32_t slots = 0;            // in a period of the schedule
    std::vector<int32_t> before;  // its slots in schedule_[0, k), k = 0..kPeriod
    uint64_t seed = 0;
    std::vector<int64_t> order;  // the current pass's window order (seed != 0)
    int64_t pass = -1;
  };
  MixtureLoader() = default;
  // The window of source s's c-th row.
  int64_t window_of(Source& src, int64_t c);
  std::string signature() const;  // LoaderState::mixture

  std::vector<Source> sources_;
  std::vector<uint8_t> schedule_;
  int B_ = 1, T_ = 1, rank_ = 0, world_ = 1;
  uint64_t seed_ = 0;
  int64_t batches_ = 0;  // global batches taken
  std::vector<int32_t> x_, y_, window_;
  int chunk_ = 0, chunks_ = 1;
  bool zigzag_ = false;
};

}  // namespace tessera
