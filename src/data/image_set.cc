#include "data/image_set.h"

#include <zlib.h>

#include <cstdio>
#include <filesystem>

#include "models/model.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

// The whole (decompressed) contents of `path`: gzread reads plain files as they are.
Result<std::vector<uint8_t>> read_maybe_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return error("cannot open '" + path + "'", "check the path and permissions");
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  int err = 0;
  const char* msg = gzerror(f, &err);
  const std::string what = err != Z_OK && err != Z_STREAM_END ? msg : "";
  gzclose(f);
  if (n < 0 || !what.empty())
    return error("'" + path + "' is not a readable IDX file: " + what,
                 "re-download or re-write it (gzip-compressed or plain)");
  return out;
}

// The file of `stem` in `dir`: stem.gz or stem.
Result<std::string> find_file(const std::string& dir, const std::string& stem) {
  for (const std::string& name : {stem + ".gz", stem})
    if (fs::is_regular_file(fs::path(dir) / name)) return (fs::path(dir) / name).string();
  return error("image folder '" + dir + "' has no " + stem + " (or " + stem + ".gz)",
               "an image folder holds train-images-idx3-ubyte, train-labels-idx1-ubyte, "
               "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (IDX files, as in "
               "/usr/share/datasets/fashion-mnist)");
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// An IDX array of u8 (type code 0x08): its dims and the offset of its data.
Result<std::vector<int64_t>> idx_dims(const std::vector<uint8_t>& b, const std::string& path) {
  if (b.size() < 4 || b[0] != 0 || b[1] != 0)
    return error("'" + path + "' is not an IDX file (no 00 00 magic)",
                 "image folders hold IDX files (the MNIST format)");
  if (b[2] != 0x08)
    return error("'" + path + "' holds IDX type 0x" + std::to_string(b[2]) + ", not u8 (0x08)",
                 "write pixels and labels as unsigned bytes");
  const size_t rank = b[3];
  if (rank < 1 || b.size() < 4 + 4 * rank)
    return error("'" + path + "' has a truncated IDX header");
  std::vector<int64_t> dims;
  int64_t n = 1;
  for (size_t i = 0; i < rank; ++i) {
    dims.push_back(be32(&b[4 + 4 * i]));
    n *= dims.back();
  }
  if (static_cast<int64_t>(b.size()) != static_cast<int64_t>(4 + 4 * rank) + n)
    return error("'" + path + "' holds " + std::to_string(b.size() - 4 - 4 * rank) +
                     " data bytes for dims needing " + std::to_string(n),
                 "the file is truncated or corrupt; re-write it");
  return dims;
}

}  // namespace

Result<ImageSet> ImageSet::open(const std::string& dir, const std::string& split) {
  if (!fs::is_directory(dir))
    return error("image folder '" + dir + "' does not exist",
                 "pass --data fashion-mnist (Debian's dataset-fashion-mnist) or a folder of IDX "
                 "files");
  ImageSet s;
  TS_ASSIGN_OR_RETURN(s.path, find_file(dir, split + "-images-idx3-ubyte"));
  TS_ASSIGN_OR_RETURN(std::string labels_path, find_file(dir, split + "-labels-idx1-ubyte"));
  TS_ASSIGN_OR_RETURN(std::vector<uint8_t> img, read_maybe_gzip(s.path));
  TS_ASSIGN_OR_RETURN(std::vector<uint8_t> lab, read_maybe_gzip(labels_path));
  TS_ASSIGN_OR_RETURN(std::vector<int64_t> d, idx_dims(img, s.path));
  TS_ASSIGN_OR_RETURN(std::vector<int64_t> ld, idx_dims(lab, labels_path));
  if (d.size() == 3) d.insert(d.begin() + 1, 1);
  if (d.size() != 4 || d[2] != d[3] || d[0] < 1)
    return error("'" + s.path + "' is not a set of square images [N, H, W] or [N, C, H, W]",
                 "write the images as an idx3 (grey) or idx4 (channels first) array");
  if (ld.size() != 1 || ld[0] != d[0])
    return error("'" + labels_path + "' does not hold one label per image of '" + s.path + "' (" +
                 std::to_string(d[0]) + ")");
  s.count = d[0];
  s.channels = d[1];
  s.size = d[2];
  const size_t header = img.size() - static_cast<size_t>(s.count * s.values_per_image());
  s.pixels.assign(img.begin() + static_cast<std::ptrdiff_t>(header), img.end());
  s.labels.assign(lab.begin() + 8, lab.end());
  return s;
}

namespace {

void put_be32(std::vector<uint8_t>* out, int64_t v) {
  for (int s = 24; s >= 0; s -= 8) out->push_back(static_cast<uint8_t>(v >> s));
}

Status write_idx(const std::string& path, const std::vector<int64_t>& dims,
                 const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (int64_t d : dims) put_be32(&out, d);
  out.insert(out.end(), data.begin(), data.end());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return error("cannot write '" + path + "'", "check the folder's permissions");
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (std::fclose(f) != 0 || !ok) return error("writing '" + path + "' failed (disk full?)");
  return Status();
}

}  // namespace

Status write_image_set(const std::string& dir, const std::string& split, const ImageSet& set) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return error("cannot create image folder '" + dir + "': " + ec.message());
  std::vector<int64_t> dims = {set.count, set.channels, set.size, set.size};
  if (set.channels == 1) dims.erase(dims.begin() + 1);
  TS_RETURN_IF_ERROR(
      write_idx((fs::path(dir) / (split + "-images-idx3-ubyte")).string(), dims, set.pixels));
  return write_idx((fs::path(dir) / (split + "-labels-idx1-ubyte")).string(), {set.count},
                   set.labels);
}

Status check_images_fit(const ImageSet& set, int64_t channels, int64_t size, int64_t classes) {
  if (set.channels != channels || set.size != size)
    return error("'" + set.path + "' holds " + std::to_string(set.channels) + "-channel " +
                     std::to_string(set.size) + "x" + std::to_string(set.size) +
                     " images; the model takes " + std::to_string(channels) + "-channel " +
                     std::to_string(size) + "x" + std::to_string(size) + " ones",
                 "choose a model whose image_size and channels match the data (vit-tiny: 28, 1)");
  for (size_t i = 0; i < set.labels.size(); ++i)
    if (set.labels[i] >= classes)
      return error("'" + set.path + "': image " + std::to_string(i) + " has label " +
                       std::to_string(set.labels[i]) + ", but the model has " +
                       std::to_string(classes) + " classes",
                   "use a model config with vocab_size (its classes) above every label");
  return Status();
}

Result<ImageLoader> ImageLoader::open(std::shared_ptr<const ImageSet> set, int B, int rank,
                                      int world, uint64_t seed) {
  if (B < 1 || world < 1 || rank < 0 || rank >= world)
    return error("image loader: batch " + std::to_string(B) + " per rank, rank " +
                 std::to_string(rank) + " of " + std::to_string(world) + " is out of range");
  const int64_t rows = static_cast<int64_t>(world) * B;
  if (set->count < rows)
    return error("'" + set->path + "' holds " + std::to_string(set->count) +
                     " images, fewer than one global batch of " + std::to_string(rows),
                 "use a smaller --batch");
  return ImageLoader(std::move(set), B, rank, world, seed);
}

ImageLoader::ImageLoader(std::shared_ptr<const ImageSet> set, int B, int rank, int world,
                         uint64_t seed)
    : set_(std::move(set)), order_(set_->count, B, rank, world, seed) {}

void ImageLoader::next(HostBatch* batch) {
  order_.next(&rows_);
  const int64_t n = set_->values_per_image();
  x_.resize(rows_.size() * static_cast<size_t>(n));
  y_.resize(rows_.size());
  for (size_t r = 0; r < rows_.size(); ++r) {
    const uint8_t* p = set_->pixels.data() + rows_[r] * n;
    for (int64_t i = 0; i < n; ++i)
      x_[r * static_cast<size_t>(n) + static_cast<size_t>(i)] = p[i] / 255.0f;
    y_[r] = set_->labels[static_cast<size_t>(rows_[r])];
  }
  batch->append(kImagesInput, x_.data(), x_.size());
  batch->append(kLabelsInput, y_.data(), y_.size());
}

LoaderState ImageLoader::state() const {
  LoaderState s;
  order_.fill(&s);
  s.seq_len = set_->values_per_image();
  s.num_tokens = set_->count;
  return s;
}

Status ImageLoader::restore(const LoaderState& s) {
  const std::string what = "cannot restore the image loader of '" + set_->path + "'";
  const std::string hint =
      "resume with the images, global batch (world*B) and seed of the run "
      "that saved the checkpoint";
  if (s.num_tokens != set_->count || s.seq_len != set_->values_per_image())
    return error(what + ": the saved state is for " + std::to_string(s.num_tokens) + " images of " +
                     std::to_string(s.seq_len) + " values, this set has " +
                     std::to_string(set_->count) + " of " +
                     std::to_string(set_->values_per_image()),
                 hint);
  return order_.restore(s, what, hint);
}

}  // namespace tessera
