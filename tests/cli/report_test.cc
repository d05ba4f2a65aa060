// `tessera report`: the page and its plots from a run's metrics.jsonl, rendered in headless
// Chromium (Debian's package; scripts/test.sh installs it) to check it is not blank.
#include <gtest/gtest.h>
#include <zlib.h>

#include <array>
#include <fstream>
#include <set>

#include "train_fixture.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// The pixels of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes) as RGB
// triples; empty when the file is something else.
std::vector<std::array<uint8_t, 3>> png_pixels(const std::string& png) {
  auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(png[at])) << 24) | (uint32_t(uint8_t(png[at + 1])) << 16) |
           (uint32_t(uint8_t(png[at + 2])) << 8) | uint32_t(uint8_t(png[at + 3]));
  };
  if (png.size() < 33 || png.compare(1, 3, "PNG") != 0) return {};
  const uint32_t w = be32(16), h = be32(20);
  const int depth = uint8_t(png[24]), type = uint8_t(png[25]), interlace = uint8_t(png[28]);
  if (depth != 8 || (type != 2 && type != 6) || interlace != 0) return {};
  const size_t bpp = type == 6 ? 4 : 3, stride = w * bpp;
  std::string idat;
  for (size_t at = 8; at + 12 <= png.size();) {
    const uint32_t len = be32(at);
    if (png.compare(at + 4, 4, "IDAT") == 0) idat += png.substr(at + 8, len);
    at += 12 + len;
  }
  std::vector<uint8_t> raw((stride + 1) * h);
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) !=
          Z_OK ||
      raw_len != raw.size())
    return {};
  std::vector<uint8_t> img(stride * h), prev(stride, 0);
  for (uint32_t y = 0; y < h; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* out = &img[y * stride];
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= bpp ? out[x - bpp] : 0, b = prev[x], c = x >= bpp ? prev[x - bpp] : 0;
      int pred = 0;
      if (filter == 1) pred = a;
      if (filter == 2) pred = b;
      if (filter == 3) pred = (a + b) / 2;
      if (filter == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      out[x] = static_cast<uint8_t>(in[x] + pred);
    }
    std::copy(out, out + stride, prev.begin());
  }
  std::vector<std::array<uint8_t, 3>> px(size_t(w) * h);
  for (size_t i = 0; i < px.size(); ++i) px[i] = {img[i * bpp], img[i * bpp + 1], img[i * bpp + 2]};
  return px;
}

class Report : public TrainDirTest {
 protected:
  // A run's metrics: 40 steps of a falling loss, evaluations every 10 steps.
  void write_metrics(const std::string& run, const std::string& tail = "") {
    fs::create_directories(dir_ / run);
    std::ofstream out(dir_ / run / "metrics.jsonl");
    for (int s = 0; s < 40; ++s) {
      out << "{\"step\":" << s << ",\"loss\":" << 10.0 - 0.1 * s << ",\"lr\":" << 1e-3 * (s + 1)
          << ",\"tokens_per_s\":" << 4000 + 10 * s << ",\"mfu\":0.5,\"grad_norm\":1.0}\n";
      if (s % 10 == 9) out << "{\"step\":" << s << ",\"val_loss\":" << 10.2 - 0.1 * s << "}\n";
    }
    out << tail;
  }
  std::string tessera(const std::string& args, int want_rc) {
    std::string out;
    EXPECT_EQ(run_command(std::string(TESSERA_BINARY) + " " + args, &out), want_rc) << args << "\n"
                                                                                    << out;
    return out;
  }
};

TEST_F(Report, PageHasTheCurvesAndRendersInABrowser) {
  write_metrics("run", "{\"step\":40,\"loss\":6.0,\"l");  // cut off by a kill
  std::string out = tessera("report " + (dir_ / "run").string(), 0);
  EXPECT_NE(out.find("40 training steps and 4 evaluations"), std::string::npos) << out;
  EXPECT_NE(out.find("cut off"), std::string::npos) << out;
  const fs::path page = dir_ / "run/report/index.html";
  const std::string html = read_all(page);
  EXPECT_EQ(count(html, "<svg"), 3);  // loss, lr, throughput: one self-contained file
  EXPECT_NE(html.find("validation loss"), std::string::npos);
  for (const char* png : {"loss.png", "lr.png", "throughput.png"}) {
    std::vector<std::array<uint8_t, 3>> px = png_pixels(read_all(dir_ / "run/report" / png));
    EXPECT_GT(px.size(), 100000u) << png;
  }
  if (run_command("command -v chromium", &out) != 0) GTEST_SKIP() << "chromium not installed";
  const fs::path shot = dir_ / "shot.png";
  ASSERT_EQ(run_command("timeout 120 chromium --headless --no-sandbox --disable-gpu "
                        "--hide-scrollbars --window-size=1000,1400 --screenshot=" +
                            shot.string() + " file://" + page.string(),
                        &out),
            0)
      << out;
  std::vector<std::array<uint8_t, 3>> px = png_pixels(read_all(shot));
  ASSERT_EQ(px.size(), 1000u * 1400u);
  // Not blank: a good share of the page is ink (text, lines, table borders), in several colours.
  size_t ink = 0;
  std::set<std::array<uint8_t, 3>> colours;
  for (const auto& p : px) {
    ink += p[0] < 200 || p[1] < 200 || p[2] < 200;
    colours.insert(p);
  }
  EXPECT_GT(ink, px.size() / 100) << "the rendered page is (nearly) blank";
  EXPECT_GT(colours.size(), 20u);
}

// An image model's run records images/s, not tokens/s: its throughput plot and summary say
// images/s (the report failed on every ViT run: bad-inputs-7d08d5e N6).
TEST_F(Report, AnImageModelsRunPlotsImagesPerSecond) {
  fs::create_directories(dir_ / "vit");
  {
    std::ofstream out(dir_ / "vit/metrics.jsonl");
    for (int s = 0; s < 6; ++s)
      out << "{\"step\":" << s << ",\"loss\":" << 2.3 - 0.1 * s
          << ",\"lr\":0.001,\"images_per_s\":" << 900 + s << ",\"mfu\":0.02}\n";
    out << "{\"step\":5,\"val_loss\":2.0,\"val_accuracy\":0.3}\n";
  }
  std::string out = tessera("report " + (dir_ / "vit").string(), 0);
  const std::string html = read_all(dir_ / "vit/report/index.html");
  EXPECT_EQ(count(html, "<svg"), 3);
  EXPECT_NE(html.find("median images/s"), std::string::npos);
  EXPECT_EQ(html.find("tokens/s"), std::string::npos);
}

TEST_F(Report, BadRunDirectoriesAreOneError) {
  std::string out = tessera("report " + (dir_ / "nope").string(), 1);
  EXPECT_NE(out.find("does not exist"), std::string::npos) << out;
  fs::create_directories(dir_ / "empty");
  out = tessera("report " + (dir_ / "empty").string(), 1);
  EXPECT_NE(out.find("has no metrics.jsonl"), std::string::npos) << out;
  fs::create_directories(dir_ / "fresh");
  std::ofstream(dir_ / "fresh/metrics.jsonl") << "{\"step\":0,\"val_loss\":3}\n";
  out = tessera("report " + (dir_ / "fresh").string(), 1);
  EXPECT_NE(out.find("no training step yet"), std::string::npos) << out;
  write_metrics("damaged");
  std::ofstream(dir_ / "damaged/metrics.jsonl", std::ios::app) << "garbage\n{\"step\":41}\n";
  out = tessera("report " + (dir_ / "damaged").string(), 1);
  EXPECT_NE(out.find("metrics.jsonl:45 is not a JSON object"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir_ / "damaged/report/index.html"));
  // Valid JSON that is not a valid record is damage too (bad-inputs-7d08d5e N15).
  const std::pair<const char*, const char*> bad[] = {
      {"{\"step\":41,\"loss\":\"abc\"}\n", "\"loss\" is \"abc\", not a number"},
      {"{\"loss\":6.0}\n", "metrics.jsonl:45 has no integer \"step\""},
      {"{\"step\":3,\"loss\":6.0}\n", "metrics.jsonl:45 records step 3 again (after step 39)"}};
  int k = 0;
  for (const auto& [line, why] : bad) {
    const std::string run = "bad" + std::to_string(k++);
    write_metrics(run);
    std::ofstream(dir_ / run / "metrics.jsonl", std::ios::app) << line;
    out = tessera("report " + (dir_ / run).string(), 1);
    EXPECT_NE(out.find(why), std::string::npos) << out;
  }
  // A null loss is a diverged step (JSON has no NaN): reported, with a note saying so.
  write_metrics("diverged", "{\"step\":40,\"loss\":null}\n");
  out = tessera("report " + (dir_ / "diverged").string(), 0);
  EXPECT_NE(out.find("note: step 40's loss is not finite"), std::string::npos) << out;
}

}  // namespace
}  // namespace tessera
