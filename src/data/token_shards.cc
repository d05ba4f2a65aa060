#include "data/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "base/check.h"

namespace tessera {
namespace {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian and read by memcpy");

constexpr char kMagic[8] = {'T', 'S', 'T', 'O', 'K', 0, 0, 0};
constexpr const char* kRetokenizeHint =
    "re-run `tessera tokenize` to rebuild the shard from its text";

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t bytes_per_token;
  uint64_t num_tokens;
  uint32_t vocab_size;
  uint32_t reserved;
};
static_assert(sizeof(Header) == kTokenShardHeaderBytes);

std::string errno_text() { return std::strerror(errno); }

// Token i of a shard's payload, unsigned (a 4-byte id above INT32_MAX must not wrap).
uint32_t load_token(const unsigned char* data, int bytes_per_token, int64_t i) {
  if (bytes_per_token == 2) {
    uint16_t v;
    std::memcpy(&v, data + 2 * i, sizeof(v));
    return v;
  }
  uint32_t v;
  std::memcpy(&v, data + 4 * i, sizeof(v));
  return v;
}

// Writes all of `bytes` to fd, retrying on short writes and EINTR.
bool write_all(int fd, const void* bytes, size_t n) {
  const char* p = static_cast<const char*>(bytes);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Writes header and tokens to fd in the shard's width.
bool write_tokens(int fd, const Header& header, std::span<const int32_t> tokens) {
  if (!write_all(fd, &header, sizeof(header))) return false;
  if (header.bytes_per_token == 4) {
    return write_all(fd, tokens.data(), tokens.size_bytes());
  }
  constexpr size_t kChunk = size_t{1} << 16;
  std::vector<uint16_t> narrow;
  narrow.reserve(kChunk);
  for (size_t start = 0; start < tokens.size(); start += kChunk) {
    size_t end = std::min(tokens.size(), start + kChunk);
    narrow.clear();
    for (size_t i = start; i < end; ++i) narrow.push_back(static_cast<uint16_t>(tokens[i]));
    if (!write_all(fd, narrow.data(), narrow.size() * sizeof(uint16_t))) return false;
  }
  return true;
}

}  // namespace

Status write_token_shard(const std::string& path, std::span<const int32_t> tokens, int vocab_size) {
  if (vocab_size <= 0) {
    return error("cannot write token shard '" + path + "': vocab size " +
                     std::to_string(vocab_size) + " is not positive",
                 "pass the tokenizer's vocab_size()");
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      return error("cannot write token shard '" + path + "': token " + std::to_string(tokens[i]) +
                       " at index " + std::to_string(i) + " is outside the vocab [0, " +
                       std::to_string(vocab_size) + ")",
                   "the ids were not made by a tokenizer with this vocab size");
    }
  }
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = kTokenShardVersion;
  header.bytes_per_token = vocab_size <= 65536 ? 2 : 4;
  header.num_tokens = tokens.size();
  header.vocab_size = static_cast<uint32_t>(vocab_size);

  std::string tmp = path + ".tmp-XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    std::string dir = std::filesystem::path(path).parent_path().string();
    return error(
        "cannot create token shard '" + path + "': " + errno_text(),
        "check that the directory '" + (dir.empty() ? "." : dir) + "' exists and is writable");
  }
  auto fail = [&](const std::string& what) {
    std::string cause = errno_text();
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return error("cannot write token shard '" + path + "': " + what + ": " + cause,
                 "check free disk space and permissions; no partial file was left behind");
  };
  if (::fchmod(fd, 0644) != 0) return fail("chmod of " + tmp);
  if (!write_tokens(fd, header, tokens)) return fail("write to " + tmp);
  if (::fsync(fd) != 0) return fail("fsync of " + tmp);
  if (::close(fd) != 0) {
    fd = -1;
    return fail("close of " + tmp);
  }
  fd = -1;
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename of " + tmp);
  // Make the rename itself durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return Status();
}

namespace {

// Where a shard's tokens are: after a header of header_bytes, num_tokens of bytes_per_token.
struct Layout {
  uint64_t header_bytes = 0, num_tokens = 0;
  int bytes_per_token = 2;
};

// llm.c's shards (dev/data/data_common.py): a header of 256 int32 — magic 20240520, version
// (1: GPT-2's uint16 tokens; 2: LLaMA 3's uint32), the token count — then the tokens.
constexpr int32_t kLlmcMagic = 20240520;
constexpr uint64_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

// The layout of an llm.c shard, or the reason it is not one ("" and false when the file
// does not start with llm.c's magic).
Result<Layout> llmc_layout(int fd, uint64_t file_bytes) {
  int32_t h[256] = {};
  if (file_bytes < kLlmcHeaderBytes ||
      ::pread(fd, h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h)))
    return error("is " + std::to_string(file_bytes) + " bytes, shorter than llm.c's " +
                 std::to_string(kLlmcHeaderBytes) + "-byte header (truncated)");
  if (h[1] != 1 && h[1] != 2)
    return error("is an llm.c shard of version " + std::to_string(h[1]) +
                 "; versions 1 (uint16 tokens) and 2 (uint32) exist");
  if (h[2] < 0) return error("is an llm.c shard with a negative token count");
  return Layout{kLlmcHeaderBytes, static_cast<uint64_t>(h[2]), h[1] == 1 ? 2 : 4};
}

}  // namespace

Result<TokenShard> TokenShard::open(const std::string& path, int vocab_size) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    if (errno == ENOENT) {
      return error("token shard '" + path + "' does not exist",
                   "check the path, or run `tessera tokenize` to create it");
    }
    return error("cannot open token shard '" + path + "': " + errno_text(),
                 "check the file's permissions");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return error("token shard '" + path + "' is not a regular file",
                 "pass the .bin file written by `tessera tokenize`");
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  auto bad = [&](const std::string& what) {
    ::close(fd);
    return error("token shard '" + path + "' " + what, kRetokenizeHint);
  };
  int32_t first = 0;
  const bool llmc = file_bytes >= sizeof(first) &&
                    ::pread(fd, &first, sizeof(first), 0) == sizeof(first) && first == kLlmcMagic;
  Layout layout;
  uint32_t written_for = 0;  // the vocab a Tessera shard records (llm.c's record none)
  if (llmc) {
    Result<Layout> l = llmc_layout(fd, file_bytes);
    if (!l.ok()) return bad(l.status().message());
    layout = l.value();
  } else {
    Header header{};
    if (file_bytes < sizeof(Header) ||
        ::pread(fd, &header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
      return bad("is " + std::to_string(file_bytes) + " bytes, shorter than its " +
                 std::to_string(sizeof(Header)) + "-byte header (truncated, or not a token shard)");
    }
    if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0) {
      return bad(
          "does not start with the magic \"TSTOK\" nor llm.c's 20240520 (not a token "
          "shard?)");
    }
    if (header.version != kTokenShardVersion) {
      return bad("has format version " + std::to_string(header.version) +
                 ", this build reads version " + std::to_string(kTokenShardVersion));
    }
    if (header.bytes_per_token != 2 && header.bytes_per_token != 4) {
      return bad("has " + std::to_string(header.bytes_per_token) +
                 " bytes per token in its header; only 2 (uint16) and 4 (uint32) exist");
    }
    layout = Layout{sizeof(Header), header.num_tokens, static_cast<int>(header.bytes_per_token)};
    written_for = header.vocab_size;
  }
  const uint64_t payload = file_bytes - layout.header_bytes;
  const uint64_t width = static_cast<uint64_t>(layout.bytes_per_token);
  if (layout.num_tokens > payload / width || layout.num_tokens * width != payload) {
    return bad("header says " + std::to_string(layout.num_tokens) + " tokens of " +
               std::to_string(width) + " bytes (" +
               std::to_string(layout.header_bytes + layout.num_tokens * width) +
               " bytes in all) but the file is " + std::to_string(file_bytes) +
               " bytes (truncated or appended to)");
  }
  if (vocab_size <= 0 || written_for > static_cast<uint32_t>(vocab_size)) {
    return bad("was written for a vocab of " + std::to_string(written_for) +
               " ids but is being read with vocab size " + std::to_string(vocab_size) +
               " (a different tokenizer?)");
  }

  TokenShard shard;
  shard.path_ = path;
  shard.num_tokens_ = static_cast<int64_t>(layout.num_tokens);
  shard.bytes_per_token_ = layout.bytes_per_token;
  if (layout.num_tokens > 0) {
    void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) return bad("could not be memory-mapped: " + errno_text());
    shard.map_ = map;
    shard.map_bytes_ = file_bytes;
    shard.data_ = static_cast<const unsigned char*>(map) + layout.header_bytes;
  }
  ::close(fd);

  // Every id must be in the vocab: one sequential pass, reporting the first bad one.
  for (int64_t i = 0; i < shard.num_tokens_; ++i) {
    uint32_t id = load_token(shard.data_, shard.bytes_per_token_, i);
    if (id >= static_cast<uint32_t>(vocab_size)) {
      uint64_t offset = layout.header_bytes + static_cast<uint64_t>(i) * width;
      return error("token shard '" + path + "' holds token id " + std::to_string(id) +
                       " at index " + std::to_string(i) + " (byte offset " +
                       std::to_string(offset) + "), not below the vocab size " +
                       std::to_string(vocab_size),
                   std::string(kRetokenizeHint) + " with the model's tokenizer");
    }
  }
  return shard;
}

TokenShard::TokenShard(TokenShard&& other) noexcept { *this = std::move(other); }

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    data_ = std::exchange(other.data_, nullptr);
    num_tokens_ = std::exchange(other.num_tokens_, 0);
    bytes_per_token_ = other.bytes_per_token_;
  }
  return *this;
}

TokenShard::~TokenShard() { release(); }

void TokenShard::release() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  data_ = nullptr;
  num_tokens_ = 0;
}

int32_t TokenShard::operator[](int64_t i) const {
  TS_CHECK(i >= 0 && i < num_tokens_) << "token " << i << " of " << num_tokens_;
  return static_cast<int32_t>(load_token(data_, bytes_per_token_, i));
}

void TokenShard::read(int64_t start, int64_t count, int32_t* out) const {
  TS_CHECK(start >= 0 && count >= 0 && start + count <= num_tokens_)
      << "tokens [" << start << ", " << start + count << ") of " << num_tokens_;
  if (bytes_per_token_ == 4) {
    std::memcpy(out, data_ + 4 * start, static_cast<size_t>(count) * 4);
    return;
  }
  const unsigned char* p = data_ + 2 * start;
  for (int64_t k = 0; k < count; ++k) {
    uint16_t v;
    std::memcpy(&v, p + 2 * k, sizeof(v));
    out[k] = v;
  }
}

}  // namespace tessera
