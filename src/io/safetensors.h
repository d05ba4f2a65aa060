// The Hugging Face safetensors format: an 8-byte little-endian header length N, N bytes
// of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str:
// str}}, then the tensor data (offsets are relative to the start of the data).
//
//   std::vector<float> w(768 * 3072);                                  // (C, 4C)
//   TS_RETURN_IF_ERROR(save_safetensors("model.safetensors",
//                                       {{"h.0.mlp.w", {DType::f32, {768, 3072}, w.data()}}},
//                                       {{"step", "100"}}));
//   TS_ASSIGN_OR_RETURN(SafetensorsFile f, load_safetensors("model.safetensors"));
//   const TensorData& t = f.get("h.0.mlp.w");     // t.shape == {768, 3072}
//   TS_ASSIGN_OR_RETURN(const TensorData* b, f.find("h.0.mlp.b"));  // error if absent
//
// dtypes: F32, BF16, F16, I32 <-> DType::f32, bf16, f16, i32. Other safetensors dtypes
// (U16, I64, F64, ...) are rejected with an error naming the tensor, since DType has no
// counterpart for them.
//
// Failure behaviour: save_safetensors writes atomically (fs.h): on error nothing is left
// under `path` and an existing file is untouched. It rejects empty/duplicate names, the
// reserved name "__metadata__", negative dims and null data. load_safetensors validates
// the header length against the file size, the JSON, every dtype and shape, and that the
// offsets lie inside the data, do not overlap and match shape x dtype size; every error
// names the file and, where there is one, the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "io/fs.h"
#include "ir/dtype.h"

namespace tessera {

// A borrowed view of a tensor to be written; `data` holds numel x dtype_size bytes in
// row-major order and must stay valid during the call.
struct TensorRef {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// An owned tensor read from a file.
struct TensorData {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  int64_t numel() const;
  TensorRef ref() const { return {dtype, shape, bytes.data()}; }
};

using NamedTensorRefs = std::vector<std::pair<std::string, TensorRef>>;

int64_t shape_numel(const std::vector<int64_t>& shape);
std::string shape_to_string(const std::vector<int64_t>& shape);  // "(768, 3072)"

// "F32" <-> DType::f32 and so on. Unknown names give nullopt.
const char* safetensors_dtype_name(DType dtype);
std::optional<DType> parse_safetensors_dtype(std::string_view name);

// Writes tensors in the given order (the reader gives them back in that order). If
// `digest_crc` is not null it receives the CRC-32C of the whole file as written (fs.h),
// and `digest_bytes` its size, so callers need not read the file again.
Status save_safetensors(const std::string& path, const NamedTensorRefs& tensors,
                        const std::map<std::string, std::string>& metadata = {},
                        uint32_t* digest_crc = nullptr, int64_t* digest_bytes = nullptr);

// One header entry, without its data.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // byte offsets relative to the start of the data section
  int64_t end = 0;
  // The file's dtype name when DType has no counterpart for it (U8, BOOL, I64, F64, ...),
  // which only headers read with keep_other_dtypes hold; `dtype` is meaningless then.
  std::string other_dtype;
};

// The parsed, validated header of a file.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in file (data offset) order
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;  // absolute file offset of the data section
  int64_t file_size = 0;
};

// Reads and validates only the header (cheap for large files). With keep_other_dtypes,
// tensors of the other safetensors dtypes are listed (with other_dtype set) instead of
// refused, for readers that skip them (a Hugging Face file's U8 mask buffers).
Result<SafetensorsHeader> load_safetensors_header(const std::string& path,
                                                  bool keep_other_dtypes = false);

// A file whose tensors are read one at a time, for files larger than one wants in memory
// at once (a Hugging Face shard).
//   TS_ASSIGN_OR_RETURN(SafetensorsReader r, SafetensorsReader::open(path));
//   for (const SafetensorsEntry& e : r.header().entries) { TS_ASSIGN_OR_RETURN(TensorData t,
//   r.read(e)); ... }
class SafetensorsReader {
 public:
  static Result<SafetensorsReader> open(const std::string& path, bool keep_other_dtypes = false);
  const std::string& path() const;
  const SafetensorsHeader& header() const { return header_; }
  const SafetensorsEntry* find(const std::string& name) const;  // null when absent
  // An error naming the file and tensor for an entry of another dtype (other_dtype set).
  Result<TensorData> read(const SafetensorsEntry& e) const;

 private:
  explicit SafetensorsReader(RandomAccessFile file) : file_(std::move(file)) {}
  RandomAccessFile file_;
  SafetensorsHeader header_;
};

class SafetensorsFile {
 public:
  const std::string& path() const { return path_; }
  // Tensor names in file (data offset) order.
  const std::vector<std::string>& names() const { return names_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t size() const { return names_.size(); }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

  // The tensor `name`; asking for an absent one is a bug (TS_CHECK). Use find() for names
  // that come from the user.
  const TensorData& get(const std::string& name) const;
  // Error naming the file and the tensor (with a close match, if any) when absent.
  Result<const TensorData*> find(const std::string& name) const;
  // Moves a tensor's data out (leaves it empty); for loaders that convert in place.
  TensorData take(const std::string& name);

 private:
  friend Result<SafetensorsFile> load_safetensors(const std::string& path);
  std::string path_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, TensorData> tensors_;
};

// Reads the whole file: header validated as for load_safetensors_header, then each tensor.
Result<SafetensorsFile> load_safetensors(const std::string& path);

}  // namespace tessera
