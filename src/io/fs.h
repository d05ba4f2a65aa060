// File-system access for Tessera. Every read and write of a file goes through here, so
// that errors name the path and the OS reason, and so that tests can inject faults.
//
//   TS_ASSIGN_OR_RETURN(std::string text, read_file("configs/gpt2.toml"));
//   TS_RETURN_IF_ERROR(write_file_atomic("out/latest", "step-00000100\n"));
//
//   // Streaming an atomic write (nothing appears under `path` until commit succeeds):
//   TS_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::open("out/model.safetensors"));
//   TS_RETURN_IF_ERROR(w.append(header.data(), header.size()));
//   TS_RETURN_IF_ERROR(w.commit());        // fsync file, rename, fsync directory
//   std::string crc = w.checksum_hex();     // CRC-32C of everything appended
//
// Failure behaviour: every function returns a Status / Result whose message names the
// path and the errno text. write_file_atomic and AtomicFileWriter never leave a partial
// file under the final name: on any failure the temporary file is removed and an existing
// file at the final path is left untouched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera {

// ---- Whole-file reads and writes -------------------------------------------------------

Result<std::string> read_file(const std::string& path);
Result<std::vector<uint8_t>> read_file_bytes(const std::string& path);

// Writes `bytes` to a temporary file in the same directory, fsyncs it, renames it over
// `path` and fsyncs the directory. The directory must exist.
Status write_file_atomic(const std::string& path, std::string_view bytes);
Status write_file_atomic(const std::string& path, const std::vector<uint8_t>& bytes);

// A streaming version of write_file_atomic. Destroying it before commit() removes the
// temporary file. Move-only.
class AtomicFileWriter {
 public:
  static Result<AtomicFileWriter> open(const std::string& path);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  Status append(const void* data, size_t size);
  Status append(std::string_view bytes) { return append(bytes.data(), bytes.size()); }
  // fsync, close, rename over the final path, fsync the directory. On failure the
  // temporary file is removed. Calling anything but the accessors afterwards is a bug.
  Status commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  int64_t bytes_written() const { return bytes_written_; }
  uint32_t checksum() const { return crc_; }  // CRC-32C of the bytes appended so far
  std::string checksum_hex() const;

 private:
  AtomicFileWriter() = default;
  void abandon();  // close and unlink the temporary file

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
  int64_t bytes_written_ = 0;
  uint32_t crc_ = 0;
};

// A file opened for positioned reads. Move-only; closes on destruction.
class RandomAccessFile {
 public:
  static Result<RandomAccessFile> open(const std::string& path);
  RandomAccessFile(RandomAccessFile&& other) noexcept;
  RandomAccessFile& operator=(RandomAccessFile&& other) noexcept;
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;
  ~RandomAccessFile();

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  // Reads exactly `size` bytes at `offset`; a short read is an error ("file is truncated").
  Status read_at(int64_t offset, void* dst, size_t size) const;

 private:
  RandomAccessFile() = default;
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// ---- Directories and paths -------------------------------------------------------------

Status fsync_dir(const std::string& path);
Status fsync_file(const std::string& path);
// mkdir -p. OK if the directory exists; an error if `path` exists and is not a directory.
Status make_dirs(const std::string& path);
// rm -rf. OK if `path` does not exist.
Status remove_all(const std::string& path);
// rename(2). Replaces a file or an empty directory at `to`.
Status rename_path(const std::string& from, const std::string& to);
// Renames only if `to` does not exist; an error naming `to` if it does.
Status rename_no_replace(const std::string& from, const std::string& to);
// Atomically swaps two existing paths (renameat2 RENAME_EXCHANGE). Returns an error if the
// file system does not support it; callers may then fall back to two renames.
Status exchange_paths(const std::string& a, const std::string& b);

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
bool is_regular_file(const std::string& path);
Result<int64_t> file_size(const std::string& path);
// Names (not paths) of the entries of a directory, sorted.
Result<std::vector<std::string>> list_dir(const std::string& path);

std::string join_path(const std::string& a, const std::string& b);
std::string parent_dir(const std::string& path);  // "a/b/c" -> "a/b", "c" -> "."
std::string base_name(const std::string& path);   // "a/b/c" -> "c"

// ---- Checksums (CRC-32C, Castagnoli) ---------------------------------------------------

// Extends `crc` (0 to start) with `size` bytes: crc32c(b, crc32c(a)) == crc32c(a + b).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// 8 lower-case hex digits.
std::string crc32c_hex(uint32_t crc);
std::string checksum_hex(std::string_view bytes);
std::string checksum_hex(const void* data, size_t size);
// Streams the file; error names the path.
Result<std::string> file_checksum(const std::string& path);

namespace detail {
// The table-driven version; crc32c() uses SSE4.2 instructions when compiled for them.
uint32_t crc32c_software(const void* data, size_t size, uint32_t crc = 0);
}  // namespace detail

// ---- Fault injection (tests only) ------------------------------------------------------

enum class FsOp { open_write, write, fsync, rename, mkdir, remove };
const char* fs_op_name(FsOp op);
// When set, the hook runs before each mutating operation; a non-OK Status makes that
// operation fail with that Status (as if the OS had failed it). `path` is the file being
// created or written (an AtomicFileWriter's temporary file), the directory made, removed or
// fsynced, or a rename's destination. Pass nullptr to clear.
// Not thread-safe: set it only in single-threaded tests.
using FsFaultHook = std::function<Status(FsOp op, const std::string& path)>;
void set_fs_fault_hook(FsFaultHook hook);

}  // namespace tessera
