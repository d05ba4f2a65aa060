#include "io/fs.h"

#include <gtest/gtest.h>

#include <random>

#include "test_util.h"

namespace tessera {
namespace {

using testing::HookGuard;
using testing::TempDir;

FsFaultHook fail_on(FsOp which) {
  return [which](FsOp op, const std::string& path) {
    if (op == which) return error(std::string("injected ") + fs_op_name(op) + " failure");
    return Status();
  };
}

std::string must_read(const std::string& path) {
  Result<std::string> r = read_file(path);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : "";
}

TEST(Fs, ReadMissingFileNamesPathAndReason) {
  TempDir dir;
  Result<std::string> r = read_file(dir / "nope.txt");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(dir / "nope.txt"), std::string::npos);
  EXPECT_NE(r.status().message().find("No such file"), std::string::npos);
  EXPECT_FALSE(r.status().hint().empty());
}

TEST(Fs, ReadDirectoryIsAnError) {
  TempDir dir;
  Result<std::string> r = read_file(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(dir.path()), std::string::npos);
}

TEST(Fs, WriteAtomicRoundTripsAndReplaces) {
  TempDir dir;
  std::string bytes("a\0b\xff", 4);
  ASSERT_TRUE(write_file_atomic(dir / "f.bin", bytes).ok());
  EXPECT_EQ(must_read(dir / "f.bin"), bytes);
  Result<std::vector<uint8_t>> raw = read_file_bytes(dir / "f.bin");
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->size(), 4u);
  EXPECT_EQ((*raw)[3], 0xff);
  ASSERT_TRUE(write_file_atomic(dir / "f.bin", std::string("second")).ok());
  EXPECT_EQ(must_read(dir / "f.bin"), "second");
  // No temporary files are left behind.
  Result<std::vector<std::string>> names = list_dir(dir.path());
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names.value(), std::vector<std::string>{"f.bin"});
}

TEST(Fs, WriteIntoMissingDirectoryNamesIt) {
  TempDir dir;
  Status s = write_file_atomic(dir / "sub/f.txt", std::string("x"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir / "sub"), std::string::npos);
}

// Each injected failure must leave the old file intact and no temporary file behind.
TEST(Fs, FailedAtomicWriteLeavesExistingFileUntouched) {
  for (FsOp op : {FsOp::open_write, FsOp::write, FsOp::fsync, FsOp::rename}) {
    SCOPED_TRACE(fs_op_name(op));
    TempDir dir;
    ASSERT_TRUE(write_file_atomic(dir / "f.txt", std::string("old")).ok());
    {
      HookGuard guard(fail_on(op));
      Status s = write_file_atomic(dir / "f.txt", std::string("new contents"));
      ASSERT_FALSE(s.ok());
      EXPECT_NE(s.message().find("injected"), std::string::npos);
    }
    EXPECT_EQ(must_read(dir / "f.txt"), "old");
    Result<std::vector<std::string>> names = list_dir(dir.path());
    ASSERT_TRUE(names.ok());
    EXPECT_EQ(names.value(), std::vector<std::string>{"f.txt"});
  }
}

TEST(Fs, RenameOntoDirectoryFailsAndCleansUp) {
  TempDir dir;
  ASSERT_TRUE(make_dirs(dir / "target/child").ok());
  Status s = write_file_atomic(dir / "target", std::string("x"));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(is_directory(dir / "target/child"));
  Result<std::vector<std::string>> names = list_dir(dir.path());
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names.value(), std::vector<std::string>{"target"});
}

TEST(Fs, AtomicWriterDestroyedBeforeCommitLeavesNothing) {
  TempDir dir;
  {
    Result<AtomicFileWriter> w = AtomicFileWriter::open(dir / "f.txt");
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->append(std::string("partial")).ok());
    EXPECT_TRUE(path_exists(w->temp_path()));
    EXPECT_FALSE(path_exists(dir / "f.txt"));
  }
  Result<std::vector<std::string>> names = list_dir(dir.path());
  ASSERT_TRUE(names.ok());
  EXPECT_TRUE(names->empty());
}

TEST(Fs, AtomicWriterTracksSizeAndChecksum) {
  TempDir dir;
  Result<AtomicFileWriter> w = AtomicFileWriter::open(dir / "f.txt");
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->append(std::string("12345")).ok());
  ASSERT_TRUE(w->append(std::string("6789")).ok());
  ASSERT_TRUE(w->commit().ok());
  EXPECT_EQ(w->bytes_written(), 9);
  EXPECT_EQ(w->checksum_hex(), "e3069283");  // CRC-32C("123456789")
  Result<std::string> crc = file_checksum(dir / "f.txt");
  ASSERT_TRUE(crc.ok());
  EXPECT_EQ(crc.value(), "e3069283");
}

// Check values from RFC 3720 (iSCSI), appendix B.4, and the standard "123456789" vector.
TEST(Fs, Crc32cMatchesPublishedVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<uint8_t>(i);
    dec[i] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62a8ab43u);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46dd794eu);
  EXPECT_EQ(crc32c(dec.data(), 32), 0x113fdb5cu);
  EXPECT_EQ(detail::crc32c_software("123456789", 9), 0xe3069283u);
  EXPECT_EQ(detail::crc32c_software(ones.data(), 32), 0x62a8ab43u);
  EXPECT_EQ(checksum_hex(std::string()), "00000000");
}

TEST(Fs, Crc32cExtendsAndAgreesWithSoftwareVersion) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(10007);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t split : {size_t{0}, size_t{1}, size_t{13}, size_t{4096}, data.size()}) {
    uint32_t whole = crc32c(data.data(), data.size());
    uint32_t a = crc32c(data.data(), split);
    EXPECT_EQ(crc32c(data.data() + split, data.size() - split, a), whole) << split;
    EXPECT_EQ(detail::crc32c_software(data.data() + split, data.size() - split,
                                      detail::crc32c_software(data.data(), split)),
              whole)
        << split;
  }
  // One flipped bit changes the checksum.
  uint32_t before = crc32c(data.data(), data.size());
  data[5000] ^= 1;
  EXPECT_NE(crc32c(data.data(), data.size()), before);
}

TEST(Fs, FileChecksumStreamsLargeFiles) {
  TempDir dir;
  std::string big(3 * (1 << 20) + 17, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31 + (i >> 12));
  ASSERT_TRUE(write_file_atomic(dir / "big.bin", big).ok());
  Result<std::string> crc = file_checksum(dir / "big.bin");
  ASSERT_TRUE(crc.ok());
  EXPECT_EQ(crc.value(), checksum_hex(big));
  Result<std::string> missing = file_checksum(dir / "missing.bin");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing.bin"), std::string::npos);
}

TEST(Fs, ReadAtPastEndSaysTruncated) {
  TempDir dir;
  ASSERT_TRUE(write_file_atomic(dir / "f", std::string("0123456789")).ok());
  Result<RandomAccessFile> f = RandomAccessFile::open(dir / "f");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->size(), 10);
  char buf[8];
  ASSERT_TRUE(f->read_at(2, buf, 8).ok());
  EXPECT_EQ(std::string(buf, 8), "23456789");
  Status s = f->read_at(4, buf, 8);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unexpected end of file"), std::string::npos);
  EXPECT_NE(s.hint().find("truncated"), std::string::npos);
}

TEST(Fs, DirectoriesAndPaths) {
  TempDir dir;
  ASSERT_TRUE(make_dirs(dir / "a/b/c").ok());
  EXPECT_TRUE(is_directory(dir / "a/b/c"));
  EXPECT_TRUE(make_dirs(dir / "a/b/c").ok());  // idempotent
  ASSERT_TRUE(write_file_atomic(dir / "a/file", std::string("x")).ok());
  Status s = make_dirs(dir / "a/file");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("a/file"), std::string::npos);
  Result<std::vector<std::string>> names = list_dir(dir / "a");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names.value(), (std::vector<std::string>{"b", "file"}));
  Result<int64_t> size = file_size(dir / "a/file");
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(size.value(), 1);
  ASSERT_TRUE(remove_all(dir / "a").ok());
  EXPECT_FALSE(path_exists(dir / "a"));
  EXPECT_TRUE(remove_all(dir / "a").ok());  // missing is fine
  EXPECT_TRUE(fsync_dir(dir.path()).ok());
  EXPECT_FALSE(fsync_dir(dir / "missing").ok());
  EXPECT_FALSE(list_dir(dir / "missing").ok());

  EXPECT_EQ(parent_dir("a/b/c"), "a/b");
  EXPECT_EQ(parent_dir("c"), ".");
  EXPECT_EQ(parent_dir("/c"), "/");
  EXPECT_EQ(parent_dir("a/b/"), "a");
  EXPECT_EQ(base_name("a/b/c"), "c");
  EXPECT_EQ(base_name("a/b/"), "b");
  EXPECT_EQ(join_path("a", "b"), "a/b");
  EXPECT_EQ(join_path("a/", "b"), "a/b");
}

TEST(Fs, RenameNoReplaceAndExchange) {
  TempDir dir;
  ASSERT_TRUE(write_file_atomic(dir / "x", std::string("X")).ok());
  ASSERT_TRUE(write_file_atomic(dir / "y", std::string("Y")).ok());
  Status s = rename_no_replace(dir / "x", dir / "y");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("exists"), std::string::npos);
  EXPECT_EQ(must_read(dir / "y"), "Y");
  ASSERT_TRUE(exchange_paths(dir / "x", dir / "y").ok());
  EXPECT_EQ(must_read(dir / "x"), "Y");
  EXPECT_EQ(must_read(dir / "y"), "X");
  ASSERT_TRUE(rename_no_replace(dir / "x", dir / "z").ok());
  EXPECT_FALSE(path_exists(dir / "x"));
  EXPECT_EQ(must_read(dir / "z"), "Y");
}

TEST(Fs, FaultHookFailsMkdirAndRemove) {
  TempDir dir;
  {
    HookGuard guard(fail_on(FsOp::mkdir));
    EXPECT_FALSE(make_dirs(dir / "new").ok());
  }
  EXPECT_FALSE(path_exists(dir / "new"));
  ASSERT_TRUE(make_dirs(dir / "new").ok());
  {
    HookGuard guard(fail_on(FsOp::remove));
    EXPECT_FALSE(remove_all(dir / "new").ok());
  }
  EXPECT_TRUE(is_directory(dir / "new"));
}

}  // namespace
}  // namespace tessera
