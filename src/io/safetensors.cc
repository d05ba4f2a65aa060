#include "io/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "base/check.h"
#include "io/fs.h"
#include "io/toml_config.h"  // closest_match

namespace tessera {
namespace {

// Hugging Face's reader refuses headers above 100 MB; so do we.
constexpr int64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

Status file_error(const std::string& path, const std::string& what, std::string hint = {}) {
  if (hint.empty()) hint = "the file is corrupt or not a safetensors file; re-create it";
  return error("safetensors file '" + path + "': " + what, std::move(hint));
}

Status tensor_error(const std::string& path, const std::string& name, const std::string& what,
                    std::string hint = {}) {
  return file_error(path, "tensor '" + name + "': " + what, std::move(hint));
}

// A non-negative JSON integer, or nullopt.
std::optional<int64_t> as_nonneg_int(const nlohmann::json& j) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return std::nullopt;
    return v;
  }
  return std::nullopt;
}

// numel x element size, or nullopt on overflow.
std::optional<int64_t> byte_size(int64_t elem_size, const std::vector<int64_t>& shape) {
  int64_t n = elem_size;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

// Element sizes of the safetensors dtypes DType has no counterpart for.
std::optional<int64_t> other_dtype_size(const std::string& name) {
  static const std::map<std::string, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2},
      {"U16", 2},  {"U32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  auto it = sizes.find(name);
  if (it == sizes.end()) return std::nullopt;
  return it->second;
}

Result<SafetensorsEntry> parse_entry(const std::string& path, const std::string& name,
                                     const nlohmann::json& j, bool keep_other_dtypes) {
  if (!j.is_object()) return tensor_error(path, name, "header entry is not a JSON object");
  SafetensorsEntry e;
  e.name = name;
  auto dt = j.find("dtype");
  if (dt == j.end() || !dt->is_string()) {
    return tensor_error(path, name, "missing or non-string \"dtype\"");
  }
  std::optional<DType> dtype = parse_safetensors_dtype(dt->get<std::string>());
  int64_t elem_size = dtype ? dtype_size(*dtype) : 0;
  if (!dtype && keep_other_dtypes) {
    std::optional<int64_t> size = other_dtype_size(dt->get<std::string>());
    if (!size) return tensor_error(path, name, "unknown dtype \"" + dt->get<std::string>() + "\"");
    e.other_dtype = dt->get<std::string>();
    elem_size = *size;
    dtype = DType::f32;
  }
  if (!dtype) {
    return tensor_error(path, name, "unsupported dtype \"" + dt->get<std::string>() + "\"",
                        "Tessera reads F32, BF16, F16 and I32; convert the tensor to one of "
                        "these before loading");
  }
  e.dtype = *dtype;
  auto sh = j.find("shape");
  if (sh == j.end() || !sh->is_array()) {
    return tensor_error(path, name, "missing or non-array \"shape\"");
  }
  for (const auto& d : *sh) {
    std::optional<int64_t> v = as_nonneg_int(d);
    if (!v)
      return tensor_error(path, name,
                          "shape " + sh->dump() +
                              " has a non-integer or "
                              "negative dimension");
    e.shape.push_back(*v);
  }
  auto off = j.find("data_offsets");
  if (off == j.end() || !off->is_array() || off->size() != 2) {
    return tensor_error(path, name, "missing \"data_offsets\" or not a [begin, end] pair");
  }
  std::optional<int64_t> begin = as_nonneg_int((*off)[0]), end = as_nonneg_int((*off)[1]);
  if (!begin || !end || *begin > *end) {
    return tensor_error(path, name, "invalid data_offsets " + off->dump());
  }
  e.begin = *begin;
  e.end = *end;
  std::optional<int64_t> want = byte_size(elem_size, e.shape);
  if (!want) return tensor_error(path, name, "shape " + sh->dump() + " is too large");
  if (*want != e.end - e.begin) {
    return tensor_error(path, name,
                        "data_offsets " + off->dump() + " span " + std::to_string(e.end - e.begin) +
                            " bytes but shape " + shape_to_string(e.shape) + " of " +
                            dt->get<std::string>() + " needs " + std::to_string(*want));
  }
  return e;
}

}  // namespace

// ---- Small helpers -----------------------------------------------------------------------

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorData::numel() const { return shape_numel(shape); }

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + ")";
}

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
  }
  return "?";
}

std::optional<DType> parse_safetensors_dtype(std::string_view name) {
  if (name == "F32") return DType::f32;
  if (name == "BF16") return DType::bf16;
  if (name == "F16") return DType::f16;
  if (name == "I32") return DType::i32;
  return std::nullopt;
}

// ---- Writer ------------------------------------------------------------------------------

Status save_safetensors(const std::string& path, const NamedTensorRefs& tensors,
                        const std::map<std::string, std::string>& metadata, uint32_t* digest_crc,
                        int64_t* digest_bytes) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  std::set<std::string> seen;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    auto fail = [&](const std::string& what, const std::string& hint) {
      return error("saving '" + path + "': tensor '" + name + "': " + what, hint);
    };
    if (name.empty()) return fail("empty tensor name", "give every tensor a name");
    if (name == kMetadataKey) return fail("the name is reserved", "rename the tensor");
    if (!seen.insert(name).second) return fail("duplicate name", "tensor names must be unique");
    std::optional<int64_t> nbytes = byte_size(dtype_size(t.dtype), t.shape);
    if (!nbytes) {
      return fail("invalid shape " + shape_to_string(t.shape), "dimensions must be >= 0");
    }
    if (*nbytes > 0 && t.data == nullptr) return fail("null data", "pass the tensor's buffer");
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + *nbytes}}};
    offset += *nbytes;
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as Hugging Face does.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));

  TS_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::open(path));
  TS_RETURN_IF_ERROR(w.append(len, 8));
  TS_RETURN_IF_ERROR(w.append(text));
  for (const auto& [name, t] : tensors) {
    size_t n = static_cast<size_t>(*byte_size(dtype_size(t.dtype), t.shape));
    if (n > 0) TS_RETURN_IF_ERROR(w.append(t.data, n));
  }
  TS_RETURN_IF_ERROR(w.commit());
  if (digest_crc) *digest_crc = w.checksum();
  if (digest_bytes) *digest_bytes = w.bytes_written();
  return Status();
}

// ---- Reader ------------------------------------------------------------------------------

namespace {

Result<SafetensorsHeader> read_header(const RandomAccessFile& f, bool keep_other_dtypes) {
  const std::string& path = f.path();
  SafetensorsHeader h;
  h.file_size = f.size();
  if (f.size() < 8) {
    return file_error(path, "file is " + std::to_string(f.size()) +
                                " bytes, too short for the 8-byte header length");
  }
  uint8_t len_bytes[8];
  TS_RETURN_IF_ERROR(f.read_at(0, len_bytes, 8));
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= uint64_t{len_bytes[i]} << (8 * i);
  if (len > static_cast<uint64_t>(f.size() - 8)) {
    return file_error(path,
                      "header length " + std::to_string(len) +
                          " runs past the end of "
                          "the file (" +
                          std::to_string(f.size()) + " bytes)",
                      "the file is truncated or not a safetensors file; re-create it");
  }
  if (len > static_cast<uint64_t>(kMaxHeaderBytes)) {
    return file_error(path, "header length " + std::to_string(len) + " exceeds the 100 MB limit");
  }
  h.data_start = 8 + static_cast<int64_t>(len);
  std::string text(len, '\0');
  TS_RETURN_IF_ERROR(f.read_at(8, text.data(), text.size()));

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return file_error(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return file_error(path, "header is not a JSON object");

  for (const auto& [key, value] : j.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) return file_error(path, "\"__metadata__\" is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return file_error(path, "metadata value for '" + mk + "' is not a string");
        }
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    TS_ASSIGN_OR_RETURN(SafetensorsEntry e, parse_entry(path, key, value, keep_other_dtypes));
    h.entries.push_back(std::move(e));
  }

  std::sort(h.entries.begin(), h.entries.end(), [](const auto& a, const auto& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  const int64_t data_size = f.size() - h.data_start;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : h.entries) {
    if (e.end > data_size) {
      return tensor_error(path, e.name,
                          "data_offsets [" + std::to_string(e.begin) + ", " +
                              std::to_string(e.end) + "] run past the end of the data (" +
                              std::to_string(data_size) + " bytes)",
                          "the file is truncated; re-create or re-download it");
    }
    if (prev && e.begin < prev->end) {
      return tensor_error(path, e.name,
                          "data_offsets [" + std::to_string(e.begin) + ", " +
                              std::to_string(e.end) + "] overlap tensor '" + prev->name + "' [" +
                              std::to_string(prev->begin) + ", " + std::to_string(prev->end) + "]");
    }
    if (e.end > e.begin) prev = &e;
  }
  return h;
}

}  // namespace

Result<SafetensorsHeader> load_safetensors_header(const std::string& path, bool keep_other_dtypes) {
  TS_ASSIGN_OR_RETURN(RandomAccessFile f, RandomAccessFile::open(path));
  return read_header(f, keep_other_dtypes);
}

Result<SafetensorsReader> SafetensorsReader::open(const std::string& path, bool keep_other_dtypes) {
  TS_ASSIGN_OR_RETURN(RandomAccessFile f, RandomAccessFile::open(path));
  TS_ASSIGN_OR_RETURN(SafetensorsHeader h, read_header(f, keep_other_dtypes));
  SafetensorsReader r(std::move(f));
  r.header_ = std::move(h);
  return r;
}

const std::string& SafetensorsReader::path() const { return file_.path(); }

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  for (const SafetensorsEntry& e : header_.entries)
    if (e.name == name) return &e;
  return nullptr;
}

Result<TensorData> SafetensorsReader::read(const SafetensorsEntry& e) const {
  if (!e.other_dtype.empty())
    return tensor_error(path(), e.name, "unsupported dtype \"" + e.other_dtype + "\"",
                        "Tessera reads F32, BF16, F16 and I32; convert the tensor to one of "
                        "these before loading");
  TensorData t;
  t.dtype = e.dtype;
  t.shape = e.shape;
  t.bytes.resize(static_cast<size_t>(e.end - e.begin));
  Status s = file_.read_at(header_.data_start + e.begin, t.bytes.data(), t.bytes.size());
  if (!s.ok()) return s.with_context("tensor '" + e.name + "'");
  return t;
}

Result<SafetensorsFile> load_safetensors(const std::string& path) {
  TS_ASSIGN_OR_RETURN(RandomAccessFile f, RandomAccessFile::open(path));
  TS_ASSIGN_OR_RETURN(SafetensorsHeader h, read_header(f, /*keep_other_dtypes=*/false));
  SafetensorsFile out;
  out.path_ = path;
  out.metadata_ = std::move(h.metadata);
  for (SafetensorsEntry& e : h.entries) {
    TensorData t;
    t.dtype = e.dtype;
    t.shape = std::move(e.shape);
    t.bytes.resize(static_cast<size_t>(e.end - e.begin));
    Status s = f.read_at(h.data_start + e.begin, t.bytes.data(), t.bytes.size());
    if (!s.ok()) return s.with_context("tensor '" + e.name + "'");
    out.names_.push_back(e.name);
    out.tensors_.emplace(e.name, std::move(t));
  }
  return out;
}

const TensorData& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  TS_CHECK(it != tensors_.end()) << "no tensor '" << name << "' in " << path_;
  return it->second;
}

Result<const TensorData*> SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) return &it->second;
  std::string near = closest_match(name, names_);
  return error(
      "safetensors file '" + path_ + "': no tensor named '" + name + "'" +
          (near.empty() ? "" : " (did you mean '" + near + "'?)"),
      "the file holds " + std::to_string(names_.size()) + " tensors; check the name or the file");
}

TensorData SafetensorsFile::take(const std::string& name) {
  auto it = tensors_.find(name);
  TS_CHECK(it != tensors_.end()) << "no tensor '" << name << "' in " << path_;
  return std::move(it->second);
}

}  // namespace tessera
