// `tessera tokenize` end to end: a generated JSONL corpus (a folder, partly gzip) into several
// shards with bounded memory, the same tokens as a single-file run, stdin, and training from
// the folder that stops and resumes bit for bit.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "data/loader.h"
#include "train_fixture.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class TokenizeCommand : public TrainDirTest {
 protected:
  std::string run(const std::string& args, int want_rc = 0) {
    std::string out;
    EXPECT_EQ(run_command("cd " + dir_.string() + " && " + TESSERA_BINARY + " " + args, &out),
              want_rc)
        << args << "\n"
        << out;
    return out;
  }

  // `mib` MiB of JSONL documents cut from the shipped book (whole UTF-8 characters, with
  // some non-ASCII text and code), dealt over `files` files in `folder` and its part/, every
  // third one gzip-compressed; and the same documents, in the order a folder is read (its
  // paths' name order), as one text file with separators.
  void write_corpus(const fs::path& folder, const fs::path& text, size_t mib, int files) {
    std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/data/corpus/moby_dick.txt");
    const std::string book((std::istreambuf_iterator<char>(in)), {});
    std::vector<std::vector<std::string>> docs(static_cast<size_t>(files));
    const char* extra[] = {" caf\u00e9", " \u6771\u4eac", " \U0001F600", " x=1;\ny=2;"};
    size_t bytes = 0;
    for (size_t i = 0; bytes < (mib << 20); ++i) {
      size_t from = (i * 7919) % (book.size() - 8000), to = from + 300 + (i * 131) % 5000;
      auto cont = [&](size_t at) { return (static_cast<unsigned char>(book[at]) & 0xC0) == 0x80; };
      while (cont(from)) ++from;
      while (cont(to)) ++to;
      std::string doc = book.substr(from, to - from) + extra[i % 4];
      while (!doc.empty() && (doc.back() == '\n' || doc.back() == '\r')) doc.pop_back();
      while (!doc.empty() && (doc.front() == '\n' || doc.front() == '\r')) doc.erase(0, 1);
      bytes += doc.size();
      docs[i % docs.size()].push_back(std::move(doc));
    }
    fs::create_directories(folder / "part");
    std::vector<std::pair<std::string, size_t>> order;  // path, file index
    for (size_t f = 0; f < docs.size(); ++f) {
      const fs::path p = folder / (f % 2 ? "part" : "") /
                         ("d" + std::to_string(f) + ".jsonl" + (f % 3 == 2 ? ".gz" : ""));
      std::string lines;
      for (const std::string& d : docs[f]) lines += nlohmann::json{{"text", d}}.dump() + "\n";
      if (f % 3 == 2) {
        gzFile gz = gzopen(p.c_str(), "wb");
        gzwrite(gz, lines.data(), static_cast<unsigned>(lines.size()));
        gzclose(gz);
      } else {
        std::ofstream(p, std::ios::binary) << lines;
      }
      order.emplace_back(p.string(), f);
    }
    std::sort(order.begin(), order.end());
    std::ofstream txt(text, std::ios::binary);
    for (const auto& [path, f] : order)
      for (const std::string& d : docs[f]) txt << d << "<|endoftext|>";
  }

  static std::vector<int32_t> tokens_of(const fs::path& dir) {
    auto files = find_token_shards(dir.string());
    EXPECT_TRUE(files.ok()) << files.status().to_string();
    std::vector<int32_t> all;
    if (!files.ok()) return all;
    for (const auto* split : {&files->train, &files->val})
      for (const std::string& f : *split) {
        auto shard = TokenShard::open(f, 50257);
        std::vector<int32_t> ids(shard->size());
        shard->read(0, shard->size(), ids.data());
        all.insert(all.end(), ids.begin(), ids.end());
      }
    return all;
  }

  // The "peak memory" the summary line states, in MiB.
  static double peak_mib(const std::string& out) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(out, m, std::regex("peak memory ([0-9.]+) (MiB|GiB)"))) << out;
    if (m.empty()) return -1;
    return std::stod(m[1]) * (m[2] == "GiB" ? 1024 : 1);
  }
};

TEST_F(TokenizeCommand, AJsonlFolderBecomesShardsInBoundedMemoryAndTrainsResumingExactly) {
  write_corpus(dir_ / "small", dir_ / "small.txt", 8, 5);
  write_corpus(dir_ / "corpus", dir_ / "corpus.txt", 48, 7);
  const std::string flags = " --shard-tokens 1000000 --val-tokens 20000";
  const std::string small = run("tokenize --input small --out small_shards" + flags);
  const std::string big = run("tokenize --input corpus --out shards" + flags);
  const double small_peak = peak_mib(small), big_peak = peak_mib(big);
  std::printf("peak memory: %.1f MiB for 8 MiB of documents, %.1f MiB for 48 MiB\n", small_peak,
              big_peak);
  RecordProperty("peak_mib_48MiB", std::to_string(big_peak));
  // Six times the text (40 MiB more) takes less than 40 MiB more: a shard's buffer (4 MB),
  // a batch of text per thread (8 MiB) and its tokens bound it, not the corpus. (300 MB of
  // JSONL peaked at 220 MiB, 48 MiB at 223 MiB, in the build with CUDA: 174 MiB to start.)
  EXPECT_LT(big_peak, small_peak + 40) << small << "\n" << big;
  auto files = find_token_shards((dir_ / "shards").string());
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  EXPECT_GE(files->train.size(), 10u);

  // The same documents as one text file give the same tokens.
  run("tokenize --input corpus.txt --out single --shard-tokens 1000000000 --val-tokens 20000");
  const std::vector<int32_t> tokens = tokens_of(dir_ / "shards");
  EXPECT_EQ(tokens_of(dir_ / "single"), tokens);
  EXPECT_GT(tokens.size(), 10'000'000u);
  // And from stdin.
  std::string out;
  EXPECT_EQ(run_command("cd " + dir_.string() + " && cat small.txt | " + TESSERA_BINARY +
                            " tokenize --input - --out piped" + flags,
                        &out),
            0)
      << out;
  EXPECT_EQ(tokens_of(dir_ / "piped"), tokens_of(dir_ / "small_shards"));

  // Train from the folder: 10 steps, stop, resume 10 = 20 straight, bit for bit.
  const std::string train =
      "train --model gpt-tiny --data shards --batch 4 --seq 32 --steps 20 "
      "--warmup 2 --eval-every 10 --eval-batches 2 --ckpt-every 5 "
      "--sample-tokens 0 --out ";
  run(train + "straight");
  run(train + "resumed --stop-after 10");
  run(train + "resumed --resume");
  const auto a = metric_losses(dir_ / "straight/metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(metric_losses(dir_ / "resumed/metrics.jsonl"), a);
}

// A mixture's folders must share a tokenizer; a folder whose path holds a '=' is one folder.
TEST_F(TokenizeCommand, MixturesOfTwoTokenizersAreRefusedAndEqualsSignsInPathsAreFolders) {
  write_corpus(dir_ / "c", dir_ / "c.txt", 1, 2);
  run("tokenize --input c --out a --val-tokens 2000");
  run("tokenize --input c --out b --val-tokens 2000");
  nlohmann::json m = nlohmann::json::parse(std::ifstream(dir_ / "b/manifest.json"));
  m["tokenizer"]["vocab_size"] = 50000;  // as if another tokenizer had written it
  std::ofstream(dir_ / "b/manifest.json") << m.dump();
  const std::string train =
      "train --model gpt-tiny --seq 16 --batch 2 --steps 1 --sample-tokens 0 ";
  std::string out = run(train + "--data a=1,b=1 --out mix", 1);
  EXPECT_NE(out.find("'b' was tokenized by another tokenizer than 'a'"), std::string::npos) << out;
  fs::rename(dir_ / "a", dir_ / "dt=2024");
  run(train + "--data dt=2024 --out one");
}

TEST_F(TokenizeCommand, BadInputsAreNamedAndLeaveNothing) {
  std::ofstream(dir_ / "bad.jsonl") << "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n";
  std::string out = run("tokenize --input bad.jsonl --out bad_out", 1);
  EXPECT_NE(out.find("bad.jsonl' line 2 has no string field \"text\" (its fields: body)"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dir_ / "bad_out"));
  out = run("tokenize --input bad.jsonl --field body --out bad_out --shard-tokens 0", 1);
  EXPECT_NE(out.find("--shard-tokens must be positive"), std::string::npos) << out;
  out = run("tokenize --input bad.jsonl --field body --out x --val-tokens -5", 1);
  EXPECT_NE(out.find("--val-tokens must be 0 (no validation) or positive"), std::string::npos)
      << out;
  out = run("tokenize --input bad.jsonl --out x --val-tokens 5 --val-fraction 0.1", 2);
  EXPECT_NE(out.find("excludes"), std::string::npos) << out;
  out = run("tokenize --input bad.jsonl --out x --format csv", 1);
  EXPECT_NE(out.find("--format must be auto, text or jsonl"), std::string::npos) << out;
  out = run("tokenize --input bad.jsonl --out x --tokenizer nowhere", 1);
  EXPECT_NE(out.find("tokenizer 'nowhere' does not exist"), std::string::npos) << out;
  out = run("tokenize --input data --out x", 1);  // a folder of .bin files only
  EXPECT_NE(out.find("holds no .txt"), std::string::npos) << out;
}

}  // namespace
}  // namespace tessera
