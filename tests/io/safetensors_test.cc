#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "io/fs.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing::contains;
using testing::TempDir;

// Writes a safetensors file by hand: 8-byte little-endian length, header, data. Built
// independently of save_safetensors so the reader is checked against the format itself.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               int64_t declared_len = -1) {
  uint64_t len = declared_len < 0 ? header.size() : static_cast<uint64_t>(declared_len);
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  bytes += header;
  bytes += data;
  ASSERT_TRUE(write_file_atomic(path, bytes).ok());
}

std::string le_f32(std::initializer_list<float> xs) {
  std::string s;
  for (float x : xs) s.append(reinterpret_cast<const char*>(&x), 4);  // x86: little-endian
  return s;
}

// The error from loading `header`+`data`; fails the test if loading succeeds.
Status load_error(const TempDir& dir, const std::string& header, const std::string& data,
                  int64_t declared_len = -1) {
  write_raw(dir / "bad.safetensors", header, data, declared_len);
  Result<SafetensorsFile> r = load_safetensors(dir / "bad.safetensors");
  EXPECT_FALSE(r.ok()) << "loaded a bad file: " << header;
  if (r.ok()) return Status();
  EXPECT_NE(r.status().message().find(dir / "bad.safetensors"), std::string::npos)
      << r.status().message();
  return r.status();
}

TEST(Safetensors, ReadsHandWrittenFile) {
  TempDir dir;
  // Entries deliberately listed out of data order; names() follows data offsets.
  const std::string header = R"({"b":{"dtype":"I32","shape":[2],"data_offsets":[8,16]},)"
                             R"("__metadata__":{"format":"pt"},)"
                             R"("a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}})";
  int32_t ints[2] = {-7, 1 << 30};
  std::string data = le_f32({1.5f, -2.25f}) + std::string(reinterpret_cast<char*>(ints), 8);
  write_raw(dir / "m.safetensors", header, data);
  Result<SafetensorsFile> r = load_safetensors(dir / "m.safetensors");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r->metadata().at("format"), "pt");
  const TensorData& a = r->get("a");
  EXPECT_EQ(a.dtype, DType::f32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{1, 2}));
  float af[2];
  std::memcpy(af, a.bytes.data(), 8);
  EXPECT_EQ(af[0], 1.5f);
  EXPECT_EQ(af[1], -2.25f);
  const TensorData& b = r->get("b");
  EXPECT_EQ(b.dtype, DType::i32);
  int32_t bi[2];
  std::memcpy(bi, b.bytes.data(), 8);
  EXPECT_EQ(bi[0], -7);
  EXPECT_EQ(bi[1], 1 << 30);
}

TEST(Safetensors, RoundTripsEveryDtypeInOrder) {
  TempDir dir;
  std::vector<float> f32 = {0.f, -1.f, 3.25f, 1e-30f, 65504.f, -0.5f};  // (2, 3)
  std::vector<uint16_t> bf16, f16;
  for (float x : f32) {
    bf16.push_back(f32_to_bf16(x));
    f16.push_back(f32_to_f16(x));
  }
  std::vector<int32_t> i32 = {INT32_MIN, -1, 0, 1, INT32_MAX};  // (5)
  float scalar = 42.f;                                          // ()
  NamedTensorRefs tensors = {
      {"z.f32", {DType::f32, {2, 3}, f32.data()}}, {"y.bf16", {DType::bf16, {3, 2}, bf16.data()}},
      {"x.f16", {DType::f16, {6}, f16.data()}},    {"w.i32", {DType::i32, {5}, i32.data()}},
      {"v.scalar", {DType::f32, {}, &scalar}},     {"u.empty", {DType::f32, {0, 4}, nullptr}},
  };
  std::map<std::string, std::string> meta = {{"step", "100"}, {"note", "héllo \"q\""}};
  uint32_t crc = 0;
  int64_t nbytes = 0;
  ASSERT_TRUE(save_safetensors(dir / "t.safetensors", tensors, meta, &crc, &nbytes).ok());

  Result<std::string> raw = read_file(dir / "t.safetensors");
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(nbytes, static_cast<int64_t>(raw->size()));
  EXPECT_EQ(crc32c_hex(crc), checksum_hex(raw.value()));
  // Layout: header length, then JSON padded so that the data starts 8-byte aligned.
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= uint64_t{static_cast<uint8_t>((*raw)[i])} << (8 * i);
  EXPECT_EQ((8 + len) % 8, 0u);
  EXPECT_EQ((*raw)[8], '{');
  const int64_t data_bytes = 24 + 12 + 12 + 20 + 4 + 0;
  EXPECT_EQ(static_cast<int64_t>(raw->size()), 8 + static_cast<int64_t>(len) + data_bytes);
  EXPECT_EQ(std::memcmp(raw->data() + 8 + len, f32.data(), 24), 0);

  Result<SafetensorsFile> r = load_safetensors(dir / "t.safetensors");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<std::string> want_names;
  for (const auto& [name, t] : tensors) want_names.push_back(name);
  // The zero-size tensor sits at the end offset of the scalar; ties keep data order.
  EXPECT_EQ(r->names(), want_names);
  EXPECT_EQ(r->metadata(), meta);
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    const TensorData& got = r->get(name);
    EXPECT_EQ(got.dtype, t.dtype);
    EXPECT_EQ(got.shape, t.shape);
    ASSERT_EQ(static_cast<int64_t>(got.bytes.size()), got.numel() * dtype_size(t.dtype));
    if (!got.bytes.empty()) {
      EXPECT_EQ(std::memcmp(got.bytes.data(), t.data, got.bytes.size()), 0);
    }
  }
  EXPECT_EQ(bf16_to_f32(reinterpret_cast<const uint16_t*>(r->get("y.bf16").bytes.data())[2]),
            3.25f);
  EXPECT_EQ(f16_to_f32(reinterpret_cast<const uint16_t*>(r->get("x.f16").bytes.data())[4]),
            65504.f);
}

TEST(Safetensors, HeaderOnlyAndFindAndTake) {
  TempDir dir;
  std::vector<float> w(12, 1.f);
  ASSERT_TRUE(
      save_safetensors(dir / "m.safetensors", {{"h.0.attn.weight", {DType::f32, {3, 4}, w.data()}}})
          .ok());
  Result<SafetensorsHeader> h = load_safetensors_header(dir / "m.safetensors");
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->entries.size(), 1u);
  EXPECT_EQ(h->entries[0].name, "h.0.attn.weight");
  EXPECT_EQ(h->entries[0].end - h->entries[0].begin, 48);
  EXPECT_EQ(h->file_size, h->data_start + 48);
  EXPECT_TRUE(h->metadata.empty());

  Result<SafetensorsFile> f = load_safetensors(dir / "m.safetensors");
  ASSERT_TRUE(f.ok());
  Result<const TensorData*> found = f->find("h.0.attn.weight");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found.value()->numel(), 12);
  Result<const TensorData*> missing = f->find("h.0.attn.weigth");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(contains(missing.status(), "no tensor named 'h.0.attn.weigth'"));
  EXPECT_TRUE(contains(missing.status(), "did you mean 'h.0.attn.weight'"));
  EXPECT_TRUE(contains(missing.status(), dir / "m.safetensors"));
  TensorData taken = f->take("h.0.attn.weight");
  EXPECT_EQ(taken.bytes.size(), 48u);
}

TEST(Safetensors, WriterRejectsBadInputAndWritesNothing) {
  TempDir dir;
  float x[2] = {1, 2};
  struct Case {
    NamedTensorRefs tensors;
    std::string expect;
  };
  std::vector<Case> cases = {
      {{{"", {DType::f32, {2}, x}}}, "empty tensor name"},
      {{{"a", {DType::f32, {2}, x}}, {"a", {DType::f32, {2}, x}}}, "duplicate"},
      {{{"__metadata__", {DType::f32, {2}, x}}}, "reserved"},
      {{{"neg", {DType::f32, {2, -1}, x}}}, "invalid shape (2, -1)"},
      {{{"null", {DType::f32, {2}, nullptr}}}, "null data"},
  };
  for (const Case& c : cases) {
    Status s = save_safetensors(dir / "out.safetensors", c.tensors);
    ASSERT_FALSE(s.ok()) << c.expect;
    EXPECT_TRUE(contains(s, c.expect)) << s.message();
    EXPECT_TRUE(contains(s, dir / "out.safetensors")) << s.message();
    EXPECT_FALSE(path_exists(dir / "out.safetensors"));
  }
}

TEST(Safetensors, RejectsCorruptHeaders) {
  TempDir dir;
  const std::string data = le_f32({1, 2});
  auto one = [](const std::string& entry) { return "{\"t\":" + entry + "}"; };
  struct Case {
    std::string header;
    std::string expect;
  };
  std::vector<Case> cases = {
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", "not valid JSON"},
      {"[1,2]", "not a JSON object"},
      {one(R"({"dtype":"F64","shape":[1],"data_offsets":[0,8]})"),
       "tensor 't': unsupported dtype \"F64\""},
      {one(R"({"dtype":"I64","shape":[1],"data_offsets":[0,8]})"), "unsupported dtype \"I64\""},
      {one(R"({"shape":[2],"data_offsets":[0,8]})"), "tensor 't': missing or non-string"},
      {one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), "negative dimension"},
      {one(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"), "data_offsets"},
      {one(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})"), "invalid data_offsets"},
      {one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"),
       "span 8 bytes but shape (3) of F32 needs 12"},
      {one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"),
       "run past the end of the data (8 bytes)"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       "tensor 'b': data_offsets [4, 8] overlap tensor 'a'"},
      {R"({"__metadata__":{"step":100}})", "metadata value for 'step' is not a string"},
      {R"({"__metadata__":[1]})", "\"__metadata__\" is not an object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    Status s = load_error(dir, c.header, data);
    EXPECT_TRUE(contains(s, c.expect)) << s.message();
    EXPECT_FALSE(s.hint().empty());
  }
}

TEST(Safetensors, RejectsBadHeaderLengthAndTruncation) {
  TempDir dir;
  const std::string header = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data = le_f32({1, 2});
  // Header length pointing past the end of the file.
  Status s = load_error(dir, header, data, 1 << 20);
  EXPECT_TRUE(contains(s, "header length 1048576 runs past the end of the file")) << s.message();
  // A file shorter than the length field.
  ASSERT_TRUE(write_file_atomic(dir / "bad.safetensors", std::string("\x05\x00", 2)).ok());
  Result<SafetensorsFile> r = load_safetensors(dir / "bad.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status(), "too short"));

  // A well-formed file cut short loses the end of its last tensor.
  std::vector<float> w(100, 3.f);
  ASSERT_TRUE(
      save_safetensors(dir / "cut.safetensors", {{"w", {DType::f32, {100}, w.data()}}}).ok());
  Result<std::string> full = read_file(dir / "cut.safetensors");
  ASSERT_TRUE(full.ok());
  ASSERT_TRUE(write_file_atomic(dir / "cut.safetensors", full->substr(0, full->size() - 10)).ok());
  r = load_safetensors(dir / "cut.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status(), "tensor 'w'")) << r.status().message();
  EXPECT_TRUE(contains(r.status(), "run past the end")) << r.status().message();
  EXPECT_NE(r.status().hint().find("truncated"), std::string::npos);

  // Missing file.
  r = load_safetensors(dir / "absent.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status(), "absent.safetensors"));
}

TEST(Safetensors, DtypeNames) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32}) {
    std::optional<DType> back = parse_safetensors_dtype(safetensors_dtype_name(t));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, t);
  }
  EXPECT_STREQ(safetensors_dtype_name(DType::bf16), "BF16");
  EXPECT_FALSE(parse_safetensors_dtype("f32").has_value());  // names are upper-case
  EXPECT_FALSE(parse_safetensors_dtype("U16").has_value());
  EXPECT_EQ(shape_to_string({2, 3}), "(2, 3)");
  EXPECT_EQ(shape_to_string({}), "()");
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({4, 0}), 0);
}

}  // namespace
}  // namespace tessera
