// Image folders (IDX files, plain or gzip) and the image loader: round trip, the errors a bad
// folder gets, the split across data-parallel ranks and restoring a saved position.
#include "data/image_set.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace tessera {
namespace {

namespace fs = std::filesystem;

class ImageSetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tessera_images_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // n images of `channels` x 4 x 4: image i's pixels are (i + j) % 256, its label i % 3.
  static ImageSet make(int64_t n, int64_t channels) {
    ImageSet s;
    s.count = n;
    s.channels = channels;
    s.size = 4;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < s.values_per_image(); ++j)
        s.pixels.push_back(static_cast<uint8_t>((i + j) % 256));
      s.labels.push_back(static_cast<uint8_t>(i % 3));
    }
    return s;
  }
  std::string dir() const { return dir_.string(); }
  fs::path dir_;
};

TEST_F(ImageSetTest, WritesAndReadsGreyAndColourFolders) {
  for (int64_t ch : {1, 3}) {
    ImageSet want = make(10, ch);
    ASSERT_TRUE(write_image_set(dir(), "train", want).ok());
    Result<ImageSet> got = ImageSet::open(dir(), "train");
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(got->count, 10);
    EXPECT_EQ(got->channels, ch);
    EXPECT_EQ(got->size, 4);
    EXPECT_EQ(got->pixels, want.pixels);
    EXPECT_EQ(got->labels, want.labels);
  }
}

TEST_F(ImageSetTest, ReadsGzipCompressedFiles) {
  ImageSet want = make(5, 1);
  ASSERT_TRUE(write_image_set(dir(), "t10k", want).ok());
  for (const char* stem : {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    const fs::path plain = dir_ / stem;
    std::ifstream in(plain, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    gzFile gz = gzopen((plain.string() + ".gz").c_str(), "wb");
    ASSERT_NE(gz, nullptr);
    ASSERT_EQ(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())), int(bytes.size()));
    gzclose(gz);
    fs::remove(plain);
  }
  Result<ImageSet> got = ImageSet::open(dir(), "t10k");
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->pixels, want.pixels);
  EXPECT_EQ(got->labels, want.labels);
}

TEST_F(ImageSetTest, BadFoldersAreRefusedNamingTheFile) {
  auto message = [&](const char* split) { return ImageSet::open(dir(), split).status().message(); };
  EXPECT_NE(message("train").find("does not exist"), std::string::npos);
  ASSERT_TRUE(write_image_set(dir(), "train", make(6, 1)).ok());
  EXPECT_NE(message("t10k").find("t10k-images-idx3-ubyte"), std::string::npos);
  // A truncated images file, then labels that do not match the images.
  const fs::path images = dir_ / "train-images-idx3-ubyte";
  fs::resize_file(images, fs::file_size(images) - 3);
  EXPECT_NE(message("train").find("data bytes for dims needing"), std::string::npos)
      << message("train");
  ASSERT_TRUE(write_image_set(dir(), "train", make(6, 1)).ok());
  ImageSet labels_only = make(5, 1);
  ASSERT_TRUE(write_image_set((dir_ / "five").string(), "train", labels_only).ok());
  fs::copy_file(dir_ / "five/train-labels-idx1-ubyte", dir_ / "train-labels-idx1-ubyte",
                fs::copy_options::overwrite_existing);
  EXPECT_NE(message("train").find("one label per image"), std::string::npos) << message("train");
  // Data that does not fit the model.
  ImageSet s = make(6, 1);
  EXPECT_TRUE(check_images_fit(s, 1, 4, 3).ok());
  EXPECT_NE(check_images_fit(s, 3, 4, 3).message().find("1-channel 4x4"), std::string::npos);
  EXPECT_NE(check_images_fit(s, 1, 4, 2).message().find("label 2"), std::string::npos);
}

// Two ranks with 2 images each see the rows of one rank with 4, shuffled, epoch after epoch;
// a restored loader continues where the saved one was.
TEST_F(ImageSetTest, LoaderSplitsRowsOverRanksAndRestores) {
  auto set = std::make_shared<ImageSet>(make(10, 1));
  auto labels = [](ImageLoader& l) {
    HostBatch b;
    l.next(&b);
    const std::vector<uint8_t>& y = b.buffer("labels");
    const std::vector<uint8_t>& x = b.buffer("images");
    EXPECT_EQ(x.size(), y.size() / 4 * 16 * 4);  // f32 pixels per i32 label
    std::vector<float> px(x.size() / 4);
    std::memcpy(px.data(), x.data(), x.size());
    for (float v : px) EXPECT_TRUE(v >= 0.0f && v <= 1.0f);
    std::vector<int32_t> out(y.size() / 4);
    std::memcpy(out.data(), y.data(), y.size());
    // The first pixel identifies the image: (i + 0) / 255.
    std::vector<int32_t> ids;
    for (size_t r = 0; r < out.size(); ++r)
      ids.push_back(static_cast<int32_t>(px[r * 16] * 255 + 0.5f));
    return ids;
  };
  ImageLoader one = ImageLoader::open(set, 4, 0, 1, 9).value();
  ImageLoader r0 = ImageLoader::open(set, 2, 0, 2, 9).value();
  ImageLoader r1 = ImageLoader::open(set, 2, 1, 2, 9).value();
  EXPECT_EQ(one.batches_per_epoch(), 2);
  for (int step = 0; step < 5; ++step) {
    std::vector<int32_t> whole = labels(one), a = labels(r0), b = labels(r1);
    a.insert(a.end(), b.begin(), b.end());
    EXPECT_EQ(a, whole) << "step " << step;
  }
  LoaderState saved = one.state();
  std::vector<int32_t> next = labels(one);
  ImageLoader again = ImageLoader::open(set, 4, 0, 1, 9).value();
  ASSERT_TRUE(again.restore(saved).ok());
  EXPECT_EQ(labels(again), next);
  ImageLoader other_seed = ImageLoader::open(set, 4, 0, 1, 8).value();
  EXPECT_NE(other_seed.restore(saved).message().find("seed"), std::string::npos);
  EXPECT_FALSE(ImageLoader::open(set, 11, 0, 1, 0).ok());  // more rows than images
}

}  // namespace
}  // namespace tessera
