// Labelled images for classification, and their loader.
//
// An image folder holds IDX files (the MNIST format; gzip-compressed or not, `.gz` or no
// suffix): train-images-idx3-ubyte and train-labels-idx1-ubyte for training, and
// t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte for validation. Images are u8 arrays
// [N, H, W] (idx3, one channel) or [N, C, H, W] (idx4), H == W; labels are u8 [N]. Debian's
// dataset-fashion-mnist installs such a folder (/usr/share/datasets/fashion-mnist), and a user
// writes their own with the same four files.
//
//   TS_ASSIGN_OR_RETURN(ImageSet train, ImageSet::open(dir, "train"));
//   TS_ASSIGN_OR_RETURN(ImageLoader loader, ImageLoader::open(std::move(train), B, rank, world,
//                                                             seed));
//   loader.next(&batch);  // "images" f32 [B, C, H, W] in [0, 1], "labels" i32 [B]
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "data/batch_stream.h"

namespace tessera {

struct ImageSet {
  std::string path;                           // the images file
  int64_t count = 0, channels = 0, size = 0;  // N, C, H (= W)
  std::vector<uint8_t> pixels;                // [N, C, H, W]
  std::vector<uint8_t> labels;                // [N]
  int64_t values_per_image() const { return channels * size * size; }

  // `split` is "train" or "t10k". Errors name the file and what is wrong with it.
  static Result<ImageSet> open(const std::string& dir, const std::string& split);
};

// Writes `set` into `dir` (created) as <split>-images-idx3-ubyte (idx4 with more than one
// channel) and <split>-labels-idx1-ubyte, uncompressed: a folder ImageSet::open reads.
Status write_image_set(const std::string& dir, const std::string& split, const ImageSet& set);

// Checks `set` against a model's images (channels, size) and classes.
Status check_images_fit(const ImageSet& set, int64_t channels, int64_t size, int64_t classes);

class ImageLoader : public BatchStream {
 public:
  // Rank `rank` of `world`, B images per rank; the set must hold world*B images or more.
  static Result<ImageLoader> open(std::shared_ptr<const ImageSet> set, int B, int rank, int world,
                                  uint64_t seed);
  // Appends "images" (pixel / 255) and "labels".
  void next(HostBatch* batch) override;
  LoaderState state() const override;
  Status restore(const LoaderState& state) override;
  int64_t batches_per_epoch() const { return order_.batches_per_epoch(); }

 private:
  ImageLoader(std::shared_ptr<const ImageSet> set, int B, int rank, int world, uint64_t seed);
  std::shared_ptr<const ImageSet> set_;
  ExampleOrder order_;
  std::vector<int64_t> rows_;
  std::vector<float> x_;
  std::vector<int32_t> y_;
};

}  // namespace tessera
