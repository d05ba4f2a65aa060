// The host data of a step's model inputs, by name (ModelGraph::inputs: a language model's
// tokens and targets, an image classifier's images and labels): for each, this rank's rows of
// one or more micro-batches, one after the other, in the input's dtype. The runtime names no
// model input; it binds whatever the graph asks for from the feed.
//
//   Feed feed(model, {tokens.data(), targets.data()});  // model.inputs' order
//   TS_ASSIGN_OR_RETURN(float loss, step->forward_backward(feed));
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "models/model.h"

namespace tessera {

class Executor;

class Feed {
 public:
  Feed() = default;
  // `data[i]` feeds model.inputs[i]; there must be one pointer per input.
  Feed(const ModelGraph& model, std::initializer_list<const void*> data);

  void set(const std::string& name, const void* data);
  // The data fed as `name` (null: none).
  const void* find(const std::string& name) const;

  // Copies micro-batch `micro` of every input of ex's graph that the feed holds into ex (a
  // micro-batch is the input's size in that graph). An input it does not hold is an error,
  // unless it is a pipeline chunk's activation or stash (set by the pipeline runner).
  Status bind(Executor& ex, int64_t micro = 0) const;

 private:
  std::vector<std::pair<std::string, const void*>> items_;
};

// A language model's feed: this rank's tokens and targets (kTokensInput, kTargetsInput).
Feed token_feed(const int32_t* tokens, const int32_t* targets);

}  // namespace tessera
