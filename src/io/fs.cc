#include "io/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#include "base/check.h"

namespace tessera {
namespace {

FsFaultHook& fault_hook() {
  static FsFaultHook hook;
  return hook;
}

Status inject(FsOp op, const std::string& path) {
  FsFaultHook& hook = fault_hook();
  if (!hook) return Status();
  return hook(op, path);
}

std::string errno_text(int err) { return std::strerror(err); }

std::string hint_for_errno(int err) {
  switch (err) {
    case ENOENT:
      return "check that the path exists and is spelled correctly";
    case EACCES:
    case EPERM:
      return "check the file permissions";
    case ENOSPC:
    case EDQUOT:
      return "free disk space or choose another output directory";
    case EROFS:
      return "the file system is read-only; choose another output directory";
    case EISDIR:
      return "the path names a directory; pass a file path";
    case ENOTDIR:
      return "a component of the path is not a directory";
    default:
      return {};
  }
}

Status os_error(const std::string& what, const std::string& path, int err) {
  return error(what + " '" + path + "': " + errno_text(err), hint_for_errno(err));
}

int open_retry(const char* path, int flags, mode_t mode = 0) {
  int fd;
  do fd = ::open(path, flags, mode);
  while (fd < 0 && errno == EINTR);
  return fd;
}

Status write_all(int fd, const std::string& path, const void* data, size_t size) {
  TS_RETURN_IF_ERROR(inject(FsOp::write, path));
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return os_error("cannot write", path, errno);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status();
}

Status fsync_fd(int fd, const std::string& path) {
  TS_RETURN_IF_ERROR(inject(FsOp::fsync, path));
  if (::fsync(fd) != 0) return os_error("cannot fsync", path, errno);
  return Status();
}

// ---- CRC-32C, slicing-by-8 (software) and SSE4.2 (hardware) ----------------------------

constexpr uint32_t kCrc32cPoly = 0x82f63b78u;  // reflected Castagnoli polynomial

struct Crc32cTables {
  uint32_t t[8][256];
  Crc32cTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kCrc32cPoly : 0u);
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xffu];
    }
  }
};

}  // namespace

namespace detail {
uint32_t crc32c_software(const void* data, size_t n, uint32_t crc) {
  static const Crc32cTables tables;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  const auto& t = tables.t;
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
        t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xffu];
  return ~c;
}
}  // namespace detail

// ---- Checksums ---------------------------------------------------------------------------

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
#if defined(__SSE4_2__)
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  uint64_t c64 = c;
  while (size >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    size -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (size--) c = _mm_crc32_u8(c, *p++);
  return ~c;
#else
  return detail::crc32c_software(data, size, crc);
#endif
}

std::string crc32c_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

std::string checksum_hex(const void* data, size_t size) { return crc32c_hex(crc32c(data, size)); }
std::string checksum_hex(std::string_view bytes) {
  return checksum_hex(bytes.data(), bytes.size());
}

Result<std::string> file_checksum(const std::string& path) {
  TS_ASSIGN_OR_RETURN(RandomAccessFile f, RandomAccessFile::open(path));
  std::vector<uint8_t> buf(size_t{1} << 20);
  uint32_t crc = 0;
  for (int64_t off = 0; off < f.size();) {
    size_t n = static_cast<size_t>(std::min<int64_t>(f.size() - off, buf.size()));
    TS_RETURN_IF_ERROR(f.read_at(off, buf.data(), n));
    crc = crc32c(buf.data(), n, crc);
    off += static_cast<int64_t>(n);
  }
  return crc32c_hex(crc);
}

// ---- Reads -------------------------------------------------------------------------------

RandomAccessFile::RandomAccessFile(RandomAccessFile&& o) noexcept
    : path_(std::move(o.path_)), fd_(o.fd_), size_(o.size_) {
  o.fd_ = -1;
}

RandomAccessFile& RandomAccessFile::operator=(RandomAccessFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    size_ = o.size_;
    o.fd_ = -1;
  }
  return *this;
}

RandomAccessFile::~RandomAccessFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<RandomAccessFile> RandomAccessFile::open(const std::string& path) {
  int fd = open_retry(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return os_error("cannot open", path, errno);
  RandomAccessFile f;
  f.path_ = path;
  f.fd_ = fd;
  struct stat st;
  if (::fstat(fd, &st) != 0) return os_error("cannot stat", path, errno);
  if (S_ISDIR(st.st_mode)) return os_error("cannot read", path, EISDIR);
  f.size_ = static_cast<int64_t>(st.st_size);
  return f;
}

Status RandomAccessFile::read_at(int64_t offset, void* dst, size_t size) const {
  TS_CHECK(fd_ >= 0) << "read_at on a closed file";
  char* p = static_cast<char*>(dst);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd_, p + done, std::min<size_t>(size - done, size_t{1} << 30),
                        static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (n < 0) {
      if (errno == EINTR) continue;
      return os_error("cannot read", path_, errno);
    }
    if (n == 0) {
      return error("'" + path_ + "': unexpected end of file at offset " +
                       std::to_string(offset + static_cast<int64_t>(done)) + " (wanted " +
                       std::to_string(size) + " bytes at offset " + std::to_string(offset) + ")",
                   "the file is truncated; re-create or re-download it");
    }
    done += static_cast<size_t>(n);
  }
  return Status();
}

Result<std::string> read_file(const std::string& path) {
  TS_ASSIGN_OR_RETURN(RandomAccessFile f, RandomAccessFile::open(path));
  std::string out(static_cast<size_t>(f.size()), '\0');
  TS_RETURN_IF_ERROR(f.read_at(0, out.data(), out.size()));
  return out;
}

Result<std::vector<uint8_t>> read_file_bytes(const std::string& path) {
  TS_ASSIGN_OR_RETURN(RandomAccessFile f, RandomAccessFile::open(path));
  std::vector<uint8_t> out(static_cast<size_t>(f.size()));
  TS_RETURN_IF_ERROR(f.read_at(0, out.data(), out.size()));
  return out;
}

// ---- Atomic writes -----------------------------------------------------------------------

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& o) noexcept
    : path_(std::move(o.path_)),
      temp_path_(std::move(o.temp_path_)),
      fd_(o.fd_),
      committed_(o.committed_),
      bytes_written_(o.bytes_written_),
      crc_(o.crc_) {
  o.fd_ = -1;
  o.committed_ = true;  // the moved-from object owns nothing
}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& o) noexcept {
  if (this != &o) {
    if (!committed_) abandon();
    path_ = std::move(o.path_);
    temp_path_ = std::move(o.temp_path_);
    fd_ = o.fd_;
    committed_ = o.committed_;
    bytes_written_ = o.bytes_written_;
    crc_ = o.crc_;
    o.fd_ = -1;
    o.committed_ = true;
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) abandon();
}

void AtomicFileWriter::abandon() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
  committed_ = true;
}

Result<AtomicFileWriter> AtomicFileWriter::open(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  std::string dir = parent_dir(path);
  if (!is_directory(dir)) {
    return error("cannot write '" + path + "': directory '" + dir + "' does not exist",
                 "create the directory first");
  }
  AtomicFileWriter w;
  w.path_ = path;
  w.temp_path_ = join_path(dir, "." + base_name(path) + ".tmp-" + std::to_string(::getpid()) + "-" +
                                    std::to_string(counter++));
  TS_RETURN_IF_ERROR(inject(FsOp::open_write, w.temp_path_));
  w.fd_ = open_retry(w.temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (w.fd_ < 0) {
    int err = errno;
    w.temp_path_.clear();  // not created: nothing to unlink
    w.committed_ = true;
    return os_error("cannot create temporary file for", path, err);
  }
  return w;
}

Status AtomicFileWriter::append(const void* data, size_t size) {
  TS_CHECK(!committed_ && fd_ >= 0) << "append after commit or failure: " << path_;
  Status s = write_all(fd_, temp_path_, data, size);
  if (!s.ok()) {
    abandon();
    return s.with_context("writing '" + path_ + "'");
  }
  bytes_written_ += static_cast<int64_t>(size);
  crc_ = crc32c(data, size, crc_);
  return Status();
}

Status AtomicFileWriter::commit() {
  TS_CHECK(!committed_ && fd_ >= 0) << "commit twice or after failure: " << path_;
  Status s = fsync_fd(fd_, temp_path_);
  if (::close(fd_) != 0 && s.ok()) s = os_error("cannot close", temp_path_, errno);
  fd_ = -1;
  if (s.ok()) s = rename_path(temp_path_, path_);
  if (!s.ok()) {
    abandon();
    return s.with_context("writing '" + path_ + "'");
  }
  committed_ = true;
  return fsync_dir(parent_dir(path_));
}

std::string AtomicFileWriter::checksum_hex() const { return crc32c_hex(crc_); }

Status write_file_atomic(const std::string& path, std::string_view bytes) {
  TS_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::open(path));
  TS_RETURN_IF_ERROR(w.append(bytes));
  return w.commit();
}

Status write_file_atomic(const std::string& path, const std::vector<uint8_t>& bytes) {
  return write_file_atomic(
      path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

// ---- Directories -------------------------------------------------------------------------

Status fsync_dir(const std::string& path) {
  int fd = open_retry(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return os_error("cannot open directory", path, errno);
  Status s = fsync_fd(fd, path);
  ::close(fd);
  return s;
}

Status fsync_file(const std::string& path) {
  int fd = open_retry(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return os_error("cannot open", path, errno);
  Status s = fsync_fd(fd, path);
  ::close(fd);
  return s;
}

Status make_dirs(const std::string& path) {
  TS_RETURN_IF_ERROR(inject(FsOp::mkdir, path));
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return os_error("cannot create directory", path, ec.value());
  if (!is_directory(path)) return os_error("cannot create directory", path, ENOTDIR);
  return Status();
}

Status remove_all(const std::string& path) {
  TS_RETURN_IF_ERROR(inject(FsOp::remove, path));
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return os_error("cannot remove", path, ec.value());
  return Status();
}

Status rename_path(const std::string& from, const std::string& to) {
  TS_RETURN_IF_ERROR(inject(FsOp::rename, to));
  if (::rename(from.c_str(), to.c_str()) != 0) {
    int err = errno;
    return error("cannot rename '" + from + "' to '" + to + "': " + errno_text(err),
                 hint_for_errno(err));
  }
  return Status();
}

Status rename_no_replace(const std::string& from, const std::string& to) {
  TS_RETURN_IF_ERROR(inject(FsOp::rename, to));
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
    return Status();
  }
  int err = errno;
  if (err == EINVAL || err == ENOSYS) {
    // The file system lacks RENAME_NOREPLACE: check, then rename (racy only against a
    // concurrent writer of the same name).
    if (path_exists(to))
      err = EEXIST;
    else if (::rename(from.c_str(), to.c_str()) == 0)
      return Status();
    else
      err = errno;
  }
  if (err == EEXIST) {
    return error("cannot rename '" + from + "' to '" + to + "': the destination exists",
                 "choose another name or remove '" + to + "'");
  }
  return error("cannot rename '" + from + "' to '" + to + "': " + errno_text(err),
               hint_for_errno(err));
}

Status exchange_paths(const std::string& a, const std::string& b) {
  TS_RETURN_IF_ERROR(inject(FsOp::rename, b));
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0) {
    int err = errno;
    return error("cannot exchange '" + a + "' and '" + b + "': " + errno_text(err),
                 hint_for_errno(err));
  }
  return Status();
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_regular_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Result<int64_t> file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return os_error("cannot stat", path, errno);
  return static_cast<int64_t>(st.st_size);
}

Result<std::vector<std::string>> list_dir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (!d) return os_error("cannot list directory", path, errno);
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty() || a == ".") return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

std::string parent_dir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string base_name(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

const char* fs_op_name(FsOp op) {
  switch (op) {
    case FsOp::open_write:
      return "open_write";
    case FsOp::write:
      return "write";
    case FsOp::fsync:
      return "fsync";
    case FsOp::rename:
      return "rename";
    case FsOp::mkdir:
      return "mkdir";
    case FsOp::remove:
      return "remove";
  }
  return "?";
}

void set_fs_fault_hook(FsFaultHook hook) { fault_hook() = std::move(hook); }

}  // namespace tessera
