#include "runtime/feed.h"

#include "base/check.h"
#include "parallel/pipeline_split.h"
#include "runtime/executor.h"

namespace tessera {

Feed::Feed(const ModelGraph& model, std::initializer_list<const void*> data) {
  TS_CHECK_EQ(data.size(), model.inputs.size()) << "one pointer per model input";
  size_t i = 0;
  for (const void* d : data) set(model.inputs[i++].name, d);
}

void Feed::set(const std::string& name, const void* data) {
  for (auto& [n, d] : items_)
    if (n == name) {
      d = data;
      return;
    }
  items_.emplace_back(name, data);
}

const void* Feed::find(const std::string& name) const {
  for (const auto& [n, d] : items_)
    if (n == name) return d;
  return nullptr;
}

Feed token_feed(const int32_t* tokens, const int32_t* targets) {
  Feed f;
  f.set(kTokensInput, tokens);
  f.set(kTargetsInput, targets);
  return f;
}

Status Feed::bind(Executor& ex, int64_t micro) const {
  const Graph& g = ex.graph();
  for (ValueId in : g.inputs()) {
    const std::string& name = g.name_of(in);
    const void* data = find(name);
    if (data == nullptr) {
      if (is_pipeline_input(name)) continue;  // the pipeline runner's to set
      return error("no data for the model input '" + name + "'",
                   "the data source must provide every input the model graph declares");
    }
    ex.set_input(name, static_cast<const uint8_t*>(data) + micro * g.type(in).bytes());
  }
  return Status();
}

}  // namespace tessera
