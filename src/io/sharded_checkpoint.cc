#include "io/sharded_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "base/log.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "io/safetensors.h"
#include "io/sharded_checkpoint_format.h"
#include "io/toml_config.h"  // closest_match, join_strings

namespace tessera {
namespace shard_detail {
std::string staging_dir(const std::string& root, const std::string& name) {
  return join_path(root, ".tmp-" + name + "-shared");
}

std::string receipt_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.json", rank);
  return buf;
}

Status ckpt_error(const std::string& dir, const std::string& what, const std::string& hint) {
  return error("checkpoint " + dir + ": " + what, hint);
}

Status check_name(const std::string& root, const std::string& name) {
  if (!detail::is_plain_checkpoint_name(name) || name == "latest") {
    return error("invalid checkpoint name '" + name + "' under " + root,
                 "use a plain directory name such as checkpoint_name(step) = \"step-00000100\"");
  }
  return Status();
}

std::string range_string(int64_t begin, int64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// numel of a shape with non-negative dims, or nullopt (negative dim or overflow).
std::optional<int64_t> checked_numel(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

// "13 (index [4, 1])": a flat element index and its row-major multi-index.
std::string element_string(int64_t flat, const std::vector<int64_t>& dims) {
  std::string s = std::to_string(flat);
  if (dims.size() < 2) return s;
  std::vector<int64_t> idx(dims.size());
  int64_t rest = flat;
  for (size_t i = dims.size(); i-- > 0;) {
    idx[i] = dims[i] == 0 ? 0 : rest % dims[i];
    rest = dims[i] == 0 ? 0 : rest / dims[i];
  }
  s += " (index [";
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + "])";
}

std::string box_string(const std::vector<int64_t>& lo, const std::vector<int64_t>& hi) {
  if (lo.empty()) return "";
  std::string s = "[";
  for (size_t d = 0; d < lo.size(); ++d)
    s += (d ? ", " : "") + std::to_string(lo[d]) + ":" + std::to_string(hi[d]);
  return s + "]";
}

std::string shard_string(const ShardDesc& s) {
  std::string where = range_string(s.offset, s.offset + s.count);
  if (!s.lo.empty()) where += " of box " + box_string(s.lo, s.hi);
  return where + " in " + s.file;
}

// Calls fn(global_offset, count, at) for each maximal run of [offset, offset + count) of the
// box [lo, hi) that is contiguous in the flattened global tensor; `at` counts from `offset`.
template <typename Fn>
void for_each_run(const std::vector<int64_t>& shape, const std::vector<int64_t>& lo,
                  const std::vector<int64_t>& hi, int64_t offset, int64_t count, Fn fn) {
  if (count == 0) return;
  if (lo.empty() || shape.empty()) {
    fn(offset, count, int64_t{0});
    return;
  }
  const size_t r = shape.size();
  std::vector<int64_t> stride(r, 1);
  for (size_t d = r - 1; d-- > 0;) stride[d] = stride[d + 1] * shape[d + 1];
  const int64_t row = hi[r - 1] - lo[r - 1];
  int64_t run_begin = -1, run_count = 0, run_at = 0;
  for (int64_t p = offset; p < offset + count;) {
    const int64_t row_index = p / row, col = p % row;
    const int64_t len = std::min(row - col, offset + count - p);
    int64_t global = lo[r - 1] + col, rest = row_index;
    for (size_t d = r - 1; d-- > 0;) {
      const int64_t extent = hi[d] - lo[d];
      global += (lo[d] + rest % extent) * stride[d];
      rest /= extent;
    }
    if (run_begin >= 0 && run_begin + run_count == global) {
      run_count += len;
    } else {
      if (run_begin >= 0) fn(run_begin, run_count, run_at);
      run_begin = global;
      run_count = len;
      run_at = p - offset;
    }
    p += len;
  }
  fn(run_begin, run_count, run_at);
}

// What is wrong with elements [offset, offset + count) of the box [lo, hi) of `shape` (lo and
// hi empty: the whole tensor), or "".
std::string check_shard_range(const std::vector<int64_t>& shape, const std::vector<int64_t>& lo,
                              const std::vector<int64_t>& hi, int64_t offset, int64_t count) {
  std::optional<int64_t> extent = checked_numel(shape);
  if (!extent) return "invalid shape " + shape_to_string(shape);
  if (!lo.empty() || !hi.empty()) {
    if (lo.size() != shape.size() || hi.size() != shape.size())
      return "a box needs one lower and one upper bound per dimension of " + shape_to_string(shape);
    std::vector<int64_t> dims(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) {
      if (lo[i] < 0 || lo[i] > hi[i] || hi[i] > shape[i])
        return "box " + box_string(lo, hi) + " is outside shape " + shape_to_string(shape);
      dims[i] = hi[i] - lo[i];
    }
    extent = checked_numel(dims);
  }
  if (offset < 0 || count < 0 || offset > *extent - count)
    return "range " + range_string(offset, offset + count) + " is outside its " +
           std::to_string(*extent) + " elements";
  return "";
}

// Reads {"offset", "count"} and the optional {"box": {"lo": [...], "hi": [...]}} of a shard
// description into s; returns what is wrong with them, or "".
std::string parse_shard_range(const nlohmann::json& d, const std::vector<int64_t>& shape,
                              ShardDesc* s) {
  if (!d.contains("offset") || !d["offset"].is_number_integer() || !d.contains("count") ||
      !d["count"].is_number_integer())
    return "no integer \"offset\" and \"count\"";
  s->offset = d["offset"];
  s->count = d["count"];
  if (d.contains("box")) {
    const nlohmann::json& b = d["box"];
    if (!b.is_object() || !b.contains("lo") || !b["lo"].is_array() || !b.contains("hi") ||
        !b["hi"].is_array())
      return "\"box\" must be {\"lo\": [...], \"hi\": [...]}";
    for (const char* key : {"lo", "hi"})
      for (const nlohmann::json& x : b[key]) {
        if (!x.is_number_integer()) return "box bounds must be integers";
        (key[0] == 'l' ? s->lo : s->hi).push_back(x.get<int64_t>());
      }
  }
  return check_shard_range(shape, s->lo, s->hi, s->offset, s->count);
}

// Builds t.cover from t.shards: of the shards holding each element, the one whose run
// reaches furthest (few file reads). Returns the first element no shard covers, or -1.
int64_t build_cover(TensorInfo& t) {
  std::vector<Segment> segs;
  for (size_t i = 0; i < t.shards.size(); ++i) {
    const ShardDesc& s = t.shards[i];
    for_each_run(t.shape, s.lo, s.hi, s.offset, s.count, [&](int64_t g, int64_t n, int64_t at) {
      segs.push_back({i, g, n, at});
    });
  }
  std::stable_sort(segs.begin(), segs.end(), [](const Segment& a, const Segment& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.count > b.count;
  });
  t.cover.clear();
  int64_t pos = 0;
  size_t next = 0;
  while (pos < t.numel) {
    const Segment* best = nullptr;
    for (; next < segs.size() && segs[next].offset <= pos; ++next)
      if (segs[next].end() > pos && (!best || segs[next].end() > best->end())) best = &segs[next];
    // Segments seen in earlier rounds end by pos: the one kept then reached furthest.
    if (!best) return pos;
    t.cover.push_back({best->shard, pos, best->end() - pos, best->at + (pos - best->offset)});
    pos = best->end();
  }
  return -1;
}

Status coverage_error(const std::string& dir, const std::string& name, const TensorInfo& t,
                      int64_t missing) {
  std::vector<std::string> have;
  for (const ShardDesc& s : t.shards) {
    if (have.size() == 8) {
      have.push_back("...");
      break;
    }
    have.push_back(shard_string(s));
  }
  return ckpt_error(dir,
                    "tensor '" + name + "' of shape " + shape_to_string(t.shape) + " (" +
                        std::to_string(t.numel) + " elements): element " +
                        element_string(missing, t.shape) + " is not covered by any shard",
                    "the ranks' shards must together cover every element of every tensor; "
                    "shards: " +
                        (have.empty() ? std::string("none") : join_strings(have)));
}

nlohmann::json shard_json(const ShardDesc& s) {
  nlohmann::json j = {
      {"file", s.file}, {"entry", s.entry}, {"offset", s.offset}, {"count", s.count}};
  if (!s.lo.empty()) j["box"] = {{"lo", s.lo}, {"hi", s.hi}};
  return j;
}

// Parses the "tessera.shards" metadata of one rank file and checks it against the header.
// Adds the shards to `tensors`, checking that dtype and shape agree with earlier files.
Status add_rank_file_shards(const std::string& dir, const std::string& file,
                            const SafetensorsHeader& header,
                            std::map<std::string, TensorInfo>& tensors,
                            std::map<std::string, std::string>& first_file) {
  auto fail = [&](const std::string& what) {
    return ckpt_error(dir, "file " + file + ": " + what,
                      "the file was not written by write_checkpoint_shards, or is corrupt");
  };
  auto meta = header.metadata.find(kShardsKey);
  if (meta == header.metadata.end()) return fail("no \"" + std::string(kShardsKey) + "\" metadata");
  nlohmann::json list;
  try {
    list = nlohmann::json::parse(meta->second);
  } catch (const nlohmann::json::parse_error& e) {
    return fail("\"" + std::string(kShardsKey) + "\" metadata is not valid JSON: " + e.what());
  }
  if (!list.is_array()) return fail("\"" + std::string(kShardsKey) + "\" metadata is not a list");
  std::map<std::string, const SafetensorsEntry*> entries;
  for (const SafetensorsEntry& e : header.entries) entries[e.name] = &e;
  for (const nlohmann::json& d : list) {
    if (!d.is_object() || !d.contains("name") || !d["name"].is_string() || !d.contains("entry") ||
        !d["entry"].is_string() || !d.contains("dtype") || !d["dtype"].is_string() ||
        !d.contains("shape") || !d["shape"].is_array()) {
      return fail("malformed shard description " + d.dump());
    }
    const std::string name = d["name"], entry = d["entry"];
    std::optional<DType> dtype = parse_dtype(d["dtype"].get<std::string>());
    if (!dtype) return fail("tensor '" + name + "': unknown dtype " + d["dtype"].dump());
    std::vector<int64_t> shape;
    for (const nlohmann::json& x : d["shape"]) {
      if (!x.is_number_integer()) return fail("tensor '" + name + "': malformed shape");
      shape.push_back(x.get<int64_t>());
    }
    ShardDesc shard;
    shard.file = file;
    shard.entry = entry;
    std::string bad = parse_shard_range(d, shape, &shard);
    if (!bad.empty()) return fail("tensor '" + name + "': invalid shard " + d.dump() + ": " + bad);
    const int64_t count = shard.count;
    auto it = entries.find(entry);
    if (it == entries.end() || it->second->dtype != *dtype ||
        it->second->shape != std::vector<int64_t>{count}) {
      return fail("tensor '" + name + "': entry '" + entry + "' is missing or does not hold " +
                  std::to_string(count) + " " + dtype_name(*dtype) + " elements");
    }
    auto [ti, inserted] = tensors.try_emplace(name);
    TensorInfo& t = ti->second;
    if (inserted) {
      t.dtype = *dtype;
      t.shape = shape;
      t.numel = *checked_numel(shape);
      first_file[name] = file;
    } else if (t.dtype != *dtype || t.shape != shape) {
      return ckpt_error(dir,
                        "tensor '" + name + "': ranks disagree on its shape or dtype: " + file +
                            " has " + shape_to_string(shape) + " " + dtype_name(*dtype) + ", " +
                            first_file[name] + " has " + shape_to_string(t.shape) + " " +
                            dtype_name(t.dtype),
                        "every rank must describe a tensor with the same global shape and "
                        "dtype; are all ranks running the same model configuration?");
    }
    t.shards.push_back(std::move(shard));
  }
  return Status();
}

}  // namespace shard_detail

using namespace shard_detail;

std::string shard_file_name(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", rank);
  return buf;
}

// ---- Reading -----------------------------------------------------------------------------

struct ShardedCheckpoint::Impl {
  struct OpenFile {
    RandomAccessFile file;
    SafetensorsHeader header;
    std::map<std::string, const SafetensorsEntry*> entries;
  };

  std::string dir;
  nlohmann::json manifest;
  bool sharded = false;
  int world = 1;
  std::map<std::string, TensorInfo> tensors;

  mutable std::mutex mu;
  mutable std::map<std::string, std::shared_ptr<const OpenFile>> open_files;

  Result<const TensorInfo*> find(const std::string& name) const;
  Result<std::shared_ptr<const OpenFile>> file(const std::string& file_name) const;
  Status copy(const std::string& name, const TensorInfo& t, const Segment& seg, int64_t begin,
              int64_t end, uint8_t* dst) const;
};

Result<const TensorInfo*> ShardedCheckpoint::Impl::find(const std::string& name) const {
  auto it = tensors.find(name);
  if (it != tensors.end()) return &it->second;
  std::vector<std::string> names;
  for (const auto& [n, t] : tensors) names.push_back(n);
  std::string near = closest_match(name, names);
  return ckpt_error(
      dir,
      "no tensor named '" + name + "'" + (near.empty() ? "" : " (did you mean '" + near + "'?)"),
      "the checkpoint holds " + std::to_string(tensors.size()) +
          " tensors; check that it was written by the same model configuration");
}

Result<std::shared_ptr<const ShardedCheckpoint::Impl::OpenFile>> ShardedCheckpoint::Impl::file(
    const std::string& file_name) const {
  std::lock_guard<std::mutex> lock(mu);
  auto it = open_files.find(file_name);
  if (it != open_files.end()) return it->second;
  const std::string path = join_path(dir, file_name);
  Result<RandomAccessFile> f = RandomAccessFile::open(path);
  if (!f.ok()) return f.status().with_context("checkpoint " + dir);
  Result<SafetensorsHeader> h = load_safetensors_header(path);
  if (!h.ok()) return h.status().with_context("checkpoint " + dir);
  auto of = std::make_shared<OpenFile>(OpenFile{std::move(f).value(), std::move(h).value(), {}});
  for (const SafetensorsEntry& e : of->header.entries) of->entries[e.name] = &e;
  open_files.emplace(file_name, of);
  return std::shared_ptr<const OpenFile>(of);
}

Status ShardedCheckpoint::Impl::copy(const std::string& name, const TensorInfo& t,
                                     const Segment& seg, int64_t begin, int64_t end,
                                     uint8_t* dst) const {
  const ShardDesc& s = t.shards[seg.shard];
  TS_ASSIGN_OR_RETURN(std::shared_ptr<const OpenFile> f, file(s.file));
  auto it = f->entries.find(s.entry);
  const int64_t esize = dtype_size(t.dtype);
  if (it == f->entries.end() || it->second->dtype != t.dtype ||
      it->second->end - it->second->begin != s.count * esize) {
    return ckpt_error(dir,
                      "file " + s.file + " has no entry '" + s.entry + "' with " +
                          std::to_string(s.count) + " " + dtype_name(t.dtype) +
                          " elements for tensor '" + name + "'",
                      kResumeHint);
  }
  const int64_t at =
      f->header.data_start + it->second->begin + (seg.at + begin - seg.offset) * esize;
  Status st = f->file.read_at(at, dst, static_cast<size_t>((end - begin) * esize));
  if (!st.ok()) return st.with_context("checkpoint " + dir + ", tensor '" + name + "'");
  return Status();
}

ShardedCheckpoint::ShardedCheckpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardedCheckpoint::ShardedCheckpoint(ShardedCheckpoint&&) noexcept = default;
ShardedCheckpoint& ShardedCheckpoint::operator=(ShardedCheckpoint&&) noexcept = default;
ShardedCheckpoint::~ShardedCheckpoint() = default;

Result<ShardedCheckpoint> ShardedCheckpoint::open(const std::string& path, bool verify_checksums) {
  TS_ASSIGN_OR_RETURN(std::string dir, resolve_checkpoint(path));
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  TS_ASSIGN_OR_RETURN(std::string text, read_file(join_path(dir, kManifest)));
  try {
    impl->manifest = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return ckpt_error(dir, "manifest.json is not valid JSON: " + std::string(e.what()),
                      kResumeHint);
  }
  const nlohmann::json& m = impl->manifest;
  if (!m.is_object() || !m.contains("format_version") || !m["format_version"].is_number_integer() ||
      !m.contains("files") || !m["files"].is_object()) {
    return ckpt_error(dir,
                      "manifest.json lacks an integer \"format_version\" or a \"files\" object",
                      "this is not a Tessera checkpoint, or its manifest was edited");
  }
  impl->sharded = m.contains("format") && m["format"] == kShardedCheckpointFormat;
  const int64_t version = m["format_version"].get<int64_t>();
  const int max_version =
      impl->sharded ? kShardedCheckpointFormatVersion : kCheckpointFormatVersion;
  if (version > max_version || version < 1) {
    return ckpt_error(dir,
                      "format_version " + std::to_string(version) +
                          " is not supported (this build reads up to " +
                          std::to_string(max_version) + ")",
                      "load it with the Tessera version that wrote it");
  }
  for (const auto& [file_name, info] : m["files"].items()) {
    TS_RETURN_IF_ERROR(detail::verify_checkpoint_file(dir, file_name, info, verify_checksums));
  }

  auto malformed = [&](const std::string& what) {
    return ckpt_error(dir, "manifest.json: " + what,
                      "the manifest was edited or is corrupt — resume from an earlier checkpoint");
  };
  if (!impl->sharded) {
    // A CheckpointWriter checkpoint: every tensor is one shard covering all of it.
    for (const auto& [file_name, info] : m["files"].items()) {
      Result<SafetensorsHeader> h = load_safetensors_header(join_path(dir, file_name));
      if (!h.ok()) return h.status().with_context("checkpoint " + dir);
      for (const SafetensorsEntry& e : h->entries) {
        TensorInfo t;
        t.dtype = e.dtype;
        t.shape = e.shape;
        t.numel = shape_numel(e.shape);
        t.shards.push_back({file_name, e.name, {}, {}, 0, t.numel});
        build_cover(t);
        if (!impl->tensors.emplace(e.name, std::move(t)).second) {
          return ckpt_error(dir, "tensor '" + e.name + "' appears in two files",
                            "tensor names must be unique across the files of a checkpoint");
        }
      }
    }
    return ShardedCheckpoint(std::move(impl));
  }

  if (!m.contains("world") || !m["world"].is_number_integer() || m["world"].get<int64_t>() < 1 ||
      m["world"].get<int64_t>() > (1 << 30)) {
    return malformed("\"world\" is missing or not a positive integer");
  }
  impl->world = m["world"].get<int>();
  if (!m.contains("tensors") || !m["tensors"].is_object()) {
    return malformed("\"tensors\" is missing or not an object");
  }
  for (const auto& [tname, tj] : m["tensors"].items()) {
    if (!tj.is_object() || !tj.contains("dtype") || !tj["dtype"].is_string() ||
        !tj.contains("shape") || !tj["shape"].is_array() || !tj.contains("shards") ||
        !tj["shards"].is_array()) {
      return malformed("entry for tensor '" + tname + "' is malformed");
    }
    TensorInfo t;
    std::optional<DType> dtype = parse_dtype(tj["dtype"].get<std::string>());
    if (!dtype) return malformed("tensor '" + tname + "' has unknown dtype " + tj["dtype"].dump());
    t.dtype = *dtype;
    for (const nlohmann::json& d : tj["shape"]) {
      if (!d.is_number_integer()) return malformed("tensor '" + tname + "' has a malformed shape");
      t.shape.push_back(d.get<int64_t>());
    }
    std::optional<int64_t> numel = checked_numel(t.shape);
    if (!numel) return malformed("tensor '" + tname + "' has an invalid shape");
    t.numel = *numel;
    for (const nlohmann::json& sj : tj["shards"]) {
      ShardDesc s;
      std::string bad = !sj.is_object() || !sj.contains("file") || !sj["file"].is_string() ||
                                !sj.contains("entry") || !sj["entry"].is_string()
                            ? "no \"file\" and \"entry\""
                            : parse_shard_range(sj, t.shape, &s);
      if (!bad.empty())
        return malformed("tensor '" + tname + "' has a malformed shard " + sj.dump() + ": " + bad);
      s.file = sj["file"];
      s.entry = sj["entry"];
      if (!m["files"].contains(s.file)) {
        return malformed("tensor '" + tname + "' has a shard in " + s.file +
                         ", which is not listed under \"files\"");
      }
      t.shards.push_back(std::move(s));
    }
    int64_t missing = build_cover(t);
    if (missing >= 0) return coverage_error(dir, tname, t, missing);
    impl->tensors.emplace(tname, std::move(t));
  }
  return ShardedCheckpoint(std::move(impl));
}

const std::string& ShardedCheckpoint::dir() const { return impl_->dir; }
const nlohmann::json& ShardedCheckpoint::manifest() const { return impl_->manifest; }
bool ShardedCheckpoint::is_sharded() const { return impl_->sharded; }
int ShardedCheckpoint::world() const { return impl_->world; }

std::vector<std::string> ShardedCheckpoint::tensor_names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : impl_->tensors) out.push_back(name);
  return out;
}

bool ShardedCheckpoint::contains(const std::string& name) const {
  return impl_->tensors.count(name) != 0;
}

Result<Shape> ShardedCheckpoint::global_shape(const std::string& name) const {
  TS_ASSIGN_OR_RETURN(const TensorInfo* t, impl_->find(name));
  return Shape(t->shape);
}

Result<DType> ShardedCheckpoint::dtype(const std::string& name) const {
  TS_ASSIGN_OR_RETURN(const TensorInfo* t, impl_->find(name));
  return t->dtype;
}

Status ShardedCheckpoint::read_raw(const std::string& name, int64_t offset, int64_t count,
                                   void* out) const {
  return read_box_raw(name, {}, {}, offset, count, out);
}

Status ShardedCheckpoint::read(const std::string& name, int64_t offset, int64_t count,
                               float* out) const {
  return read_box(name, {}, {}, offset, count, out);
}

Status ShardedCheckpoint::read_box_raw(const std::string& name, const std::vector<int64_t>& lo,
                                       const std::vector<int64_t>& hi, int64_t offset,
                                       int64_t count, void* out) const {
  TS_ASSIGN_OR_RETURN(const TensorInfo* t, impl_->find(name));
  std::string bad = check_shard_range(t->shape, lo, hi, offset, count);
  if (!bad.empty()) {
    return ckpt_error(impl_->dir,
                      "read of elements " + range_string(offset, offset + count) +
                          (lo.empty() ? "" : " of box " + box_string(lo, hi)) + " of tensor '" +
                          name + "' (shape " + shape_to_string(t->shape) + ", " +
                          std::to_string(t->numel) + " elements) is out of bounds: " + bad,
                      "ask for a box inside the shape and a range inside the box");
  }
  auto* dst = static_cast<uint8_t*>(out);
  const int64_t esize = dtype_size(t->dtype);
  Status status;
  for_each_run(t->shape, lo, hi, offset, count, [&](int64_t g, int64_t n, int64_t at) {
    for (int64_t pos = g; status.ok() && pos < g + n;) {
      // The cover piece holding pos: the last one starting at or before it.
      auto it = std::upper_bound(t->cover.begin(), t->cover.end(), pos,
                                 [](int64_t p, const Segment& c) { return p < c.offset; });
      if (it == t->cover.begin() || std::prev(it)->end() <= pos) {
        status = ckpt_error(impl_->dir,
                            "element " + element_string(pos, t->shape) + " of tensor '" + name +
                                "' is not covered by any shard",
                            kResumeHint);
        return;
      }
      const Segment& piece = *std::prev(it);
      const int64_t stop = std::min(g + n, piece.end());
      status = impl_->copy(name, *t, piece, pos, stop, dst + (at + pos - g) * esize);
      pos = stop;
    }
  });
  return status;
}

Status ShardedCheckpoint::read_box(const std::string& name, const std::vector<int64_t>& lo,
                                   const std::vector<int64_t>& hi, int64_t offset, int64_t count,
                                   float* out) const {
  TS_ASSIGN_OR_RETURN(const TensorInfo* t, impl_->find(name));
  switch (t->dtype) {
    case DType::f32:
      return read_box_raw(name, lo, hi, offset, count, out);
    case DType::bf16:
    case DType::f16: {
      std::vector<uint16_t> tmp(static_cast<size_t>(std::max<int64_t>(count, 0)));
      TS_RETURN_IF_ERROR(read_box_raw(name, lo, hi, offset, count, tmp.data()));
      for (size_t i = 0; i < tmp.size(); ++i) {
        out[i] = t->dtype == DType::bf16 ? bf16_to_f32(tmp[i]) : f16_to_f32(tmp[i]);
      }
      return Status();
    }
    case DType::i32:
      break;
  }
  return ckpt_error(impl_->dir, "tensor '" + name + "' is " + dtype_name(t->dtype) + ", not float",
                    "read it with read_raw into an int32_t buffer");
}

}  // namespace tessera
