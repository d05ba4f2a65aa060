#include "data/tokenize_corpus.h"

#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/format.h"
#include "base/log.h"
#include "data/token_shards.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr size_t kEncodeBytes = size_t{1} << 20;          // a document's pieces for encoding
constexpr size_t kBatchBytesPerThread = size_t{8} << 20;  // text read per thread per batch
constexpr int64_t kMinSplitTokens = 2;  // a split needs one input token and its target
constexpr int64_t kMaxReservedTokens = int64_t{1} << 30;
constexpr std::string_view kStagingPrefix = ".tokenize-staging-";

struct Shard {
  std::string path;
  int64_t tokens = 0;
};

// The crc32 (zlib's) and size of a file.
std::pair<uint32_t, int64_t> file_crc32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> block(size_t{1} << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  int64_t bytes = 0;
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const std::streamsize n = in.gcount();
    crc = crc32(crc, reinterpret_cast<const Bytef*>(block.data()), static_cast<uInt>(n));
    bytes += n;
  }
  return {static_cast<uint32_t>(crc), bytes};
}

// The token stream, cut into staged shards of `limit` tokens.
class ShardSink {
 public:
  ShardSink(std::string dir, int64_t limit, int vocab)
      : dir_(std::move(dir)), limit_(limit), vocab_(vocab) {}
  Status add(const std::vector<int32_t>& ids) {
    // One shard's worth, not a doubling vector's overshoot (up to 2x).
    if (buf_.capacity() == 0 && limit_ <= kMaxReservedTokens)
      buf_.reserve(static_cast<size_t>(limit_));
    for (size_t at = 0; at < ids.size();) {
      const size_t take = std::min(ids.size() - at, static_cast<size_t>(limit_) - buf_.size());
      buf_.insert(buf_.end(), ids.begin() + at, ids.begin() + at + take);
      at += take;
      if (static_cast<int64_t>(buf_.size()) == limit_) TS_RETURN_IF_ERROR(flush());
    }
    return Status();
  }
  Status flush() {
    if (buf_.empty()) return Status();
    char name[32];
    std::snprintf(name, sizeof name, "part_%06zu.bin", shards_.size());
    const std::string path = (fs::path(dir_) / name).string();
    TS_RETURN_IF_ERROR(write_token_shard(path, buf_, vocab_));
    shards_.push_back({path, static_cast<int64_t>(buf_.size())});
    total_ += static_cast<int64_t>(buf_.size());
    buf_.clear();
    buf_.shrink_to_fit();
    return Status();
  }
  std::vector<Shard>& shards() { return shards_; }
  int64_t total() const { return total_; }

 private:
  std::string dir_;
  int64_t limit_;
  int vocab_;
  std::vector<int32_t> buf_;
  std::vector<Shard> shards_;
  int64_t total_ = 0;
};

// Moves the last `val` tokens of `train`'s shards into val shards (splitting one shard where
// the cut falls inside it).
Result<std::vector<Shard>> carve_val(std::vector<Shard>* train, int64_t val, int vocab,
                                     const std::string& staging) {
  std::vector<Shard> out;
  while (val > 0) {
    Shard last = train->back();
    if (last.tokens <= val) {
      out.insert(out.begin(), last);
      train->pop_back();
      val -= last.tokens;
      continue;
    }
    const int64_t keep = last.tokens - val;
    std::vector<int32_t> head(static_cast<size_t>(keep)), tail(static_cast<size_t>(val));
    {
      TS_ASSIGN_OR_RETURN(TokenShard shard, TokenShard::open(last.path, vocab));
      shard.read(0, keep, head.data());
      shard.read(keep, val, tail.data());
    }  // unmapped before the file is replaced
    const std::string val_path = (fs::path(staging) / "val_split.bin").string();
    TS_RETURN_IF_ERROR(write_token_shard(val_path, tail, vocab));
    TS_RETURN_IF_ERROR(write_token_shard(last.path, head, vocab));
    train->back().tokens = keep;
    out.insert(out.begin(), Shard{val_path, val});
    val = 0;
  }
  return out;
}

std::string shard_name(const std::string& split, size_t index, size_t count) {
  if (count == 1) return split + ".bin";
  char name[32];
  std::snprintf(name, sizeof name, "%s_%06zu.bin", split.c_str(), index);
  return name;
}

// Encodes pieces [first, last) of `batch` into *out, in order.
void encode_pieces(const std::vector<TextPiece>& batch, size_t first, size_t last,
                   const Tokenizer& tok, std::vector<int32_t>* out) {
  for (size_t i = first; i < last; ++i) {
    const TextPiece& p = batch[i];
    if (p.starts_document) out->push_back(tok.document_start());
    bool start = p.starts_document;
    for (std::string_view chunk : split_for_encoding(p.text, kEncodeBytes, tok)) {
      tok.encode_append(chunk, out, start);
      start = false;
    }
  }
}

// Removes the staging folder (and `out` itself, when this run created it and left it empty)
// unless released.
struct StagingGuard {
  std::string staging, out;
  bool created_out = false;
  ~StagingGuard() {
    std::error_code ec;
    fs::remove_all(staging, ec);
    if (created_out && fs::is_empty(out, ec)) fs::remove(out, ec);
  }
};

// Reads every piece of the corpus and encodes it into `sink`, in order: batches of about
// kBatchBytesPerThread per thread, each cut into `threads` contiguous groups of about equal
// bytes encoded side by side.
Status encode_corpus(CorpusReader& reader, const Tokenizer& tok, int threads, ShardSink* sink,
                     int64_t* total_bytes) {
  std::vector<TextPiece> batch;
  std::vector<std::vector<int32_t>> ids;  // each thread's tokens of a batch
  bool more = true;
  while (more) {
    // Read a batch of pieces, then encode it on every thread, in order.
    batch.clear();
    size_t bytes = 0;
    const size_t want = kBatchBytesPerThread * static_cast<size_t>(threads);
    while (bytes < want) {
      TextPiece piece;
      TS_ASSIGN_OR_RETURN(more, reader.next(&piece));
      if (!more) break;
      bytes += piece.text.size();
      batch.push_back(std::move(piece));
    }
    *total_bytes += static_cast<int64_t>(bytes);
    // Contiguous groups of about equal bytes, one per thread.
    std::vector<size_t> bounds = {0};
    size_t acc = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      acc += batch[i].text.size();
      if (acc * threads >= bytes * bounds.size() && bounds.size() < size_t(threads))
        bounds.push_back(i + 1);
    }
    if (bounds.back() != batch.size()) bounds.push_back(batch.size());
    for (std::vector<int32_t>& group : ids) group.clear();  // capacity kept: no new memory
    ids.resize(std::max(ids.size(), bounds.size() - 1));
    std::vector<std::thread> workers;
    for (size_t g = 0; g + 1 < bounds.size(); ++g)
      workers.emplace_back(encode_pieces, std::cref(batch), bounds[g], bounds[g + 1],
                           std::cref(tok), &ids[g]);
    for (std::thread& w : workers) w.join();
    for (size_t g = 0; g + 1 < bounds.size(); ++g) TS_RETURN_IF_ERROR(sink->add(ids[g]));
  }
  return Status();
}

// The final names, the tokenizer and the manifest in `staging`; then all into `out`
// (replacing an earlier run's shards), the manifest last. A failed move takes the moved
// files back out. Fills sum's shard paths.
Status commit_shards(const std::string& out, const std::string& staging, const Tokenizer& tok,
                     const std::vector<CorpusSource>& sources, std::vector<Shard>& train,
                     std::vector<Shard>& val, TokenizeSummary* sum) {
  std::error_code ec;
  nlohmann::json manifest = {{"format", "tessera token shards"}, {"version", 1}};
  TS_RETURN_IF_ERROR(tok.copy_to(staging));  // travels with the shards
  const bool gpt2 = tok.name() == "gpt2";
  std::vector<std::string> tok_files;
  for (const std::string& f : tok.files())
    tok_files.push_back(gpt2 ? fs::absolute(f, ec).lexically_normal().string()
                             : fs::path(f).filename().string());
  manifest["tokenizer"] = {{"name", gpt2 ? "gpt2" : "tokenizer.json"},
                           {"vocab_size", tok.vocab_size()},
                           {"document_start", tok.document_start()},
                           {"files", tok_files}};
  for (const CorpusSource& s : sources)
    manifest["sources"].push_back(
        {{"path", s.path}, {"bytes", s.bytes}, {"documents", s.documents}});
  manifest["documents"] = sum->documents;
  manifest["tokens"] = sum->tokens;
  std::vector<std::string> staged;  // names, moved into `out` in this order
  for (auto [split, shards, paths] : {std::tuple{"train", &train, &sum->train_shards},
                                      std::tuple{"val", &val, &sum->val_shards}}) {
    manifest[split] = nlohmann::json::array();
    for (size_t i = 0; i < shards->size(); ++i) {
      const std::string name = shard_name(split, i, shards->size());
      fs::rename((*shards)[i].path, fs::path(staging) / name, ec);
      if (ec) return error("tokenize: cannot rename a staged shard: " + ec.message());
      const auto [crc, bytes] = file_crc32((fs::path(staging) / name).string());
      char hex[16];
      std::snprintf(hex, sizeof hex, "%08x", crc);
      manifest[split].push_back(
          {{"file", name}, {"tokens", (*shards)[i].tokens}, {"bytes", bytes}, {"crc32", hex}});
      paths->push_back((fs::path(out) / name).string());
      staged.push_back(name);
    }
  }
  if (!gpt2)
    for (const std::string& f : tok_files) staged.push_back(f);
  {
    std::ofstream m(fs::path(staging) / "manifest.json");
    m << manifest.dump(1) << "\n";
    if (!m.good())
      return error("tokenize: cannot write manifest.json in '" + staging + "'",
                   "check free disk space");
  }
  staged.push_back("manifest.json");
  for (const fs::directory_entry& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (is_tokenized_shard_name(name) || name == "manifest.json") fs::remove(e.path(), ec);
  }
  for (size_t i = 0; i < staged.size(); ++i) {
    fs::rename(fs::path(staging) / staged[i], fs::path(out) / staged[i], ec);
    if (!ec) continue;
    const std::string cause = ec.message();
    for (size_t k = 0; k < i; ++k) fs::remove(fs::path(out) / staged[k], ec);
    return error("tokenize: cannot move " + staged[i] + " into '" + out + "': " + cause +
                     " (the shards written are removed)",
                 "check the output directory's permissions and free space");
  }
  return Status();
}

}  // namespace

std::string data_tokenizer(const std::string& dir) {
  try {
    std::ifstream in(fs::path(dir) / "manifest.json");
    if (!in) return "";
    const nlohmann::json m = nlohmann::json::parse(in);
    const nlohmann::json& t = m.at("tokenizer");
    if (t.value("name", "") == "gpt2") return "";
    for (const nlohmann::json& f : t.at("files")) {
      const fs::path file = f.get<std::string>();
      if (file.filename() == "tokenizer.json")  // beside the shards, or where it was
        return (file.is_relative() ? fs::path(dir) / file : file).string();
    }
  } catch (const nlohmann::json::exception&) {
  }
  return "";
}

std::string data_tokenizer_identity(const std::string& dir) {
  try {
    std::ifstream in(fs::path(dir) / "manifest.json");
    if (!in) return "";
    const nlohmann::json t = nlohmann::json::parse(in).at("tokenizer");
    std::string id = t.value("name", "") + "|" + std::to_string(t.value("vocab_size", 0)) + "|" +
                     std::to_string(t.value("document_start", -1));
    if (const std::string json = data_tokenizer(dir); !json.empty())
      id += "|" + std::to_string(file_crc32(json).first);
    return id;
  } catch (const nlohmann::json::exception&) {
    return "";
  }
}

bool is_tokenized_shard_name(const std::string& name) {
  for (const char* split : {"train", "val"}) {
    const std::string s = split;
    if (name == s + ".bin") return true;
    if (name.size() == s.size() + 11 && name.rfind(s + "_", 0) == 0 &&
        name.compare(name.size() - 4, 4, ".bin") == 0 &&
        std::all_of(name.begin() + s.size() + 1, name.end() - 4, ::isdigit))
      return true;
  }
  return false;
}

std::vector<std::string_view> split_for_encoding(std::string_view text, size_t target_bytes,
                                                 const Tokenizer& tokenizer) {
  std::vector<std::string_view> chunks;
  size_t start = 0;
  while (text.size() - start > target_bytes) {
    // The first safe cut at or after start + target_bytes; none left -> one last chunk.
    const size_t cut =
        tokenizer.next_cut(text, start + std::max<size_t>(target_bytes, 1), text.size());
    if (cut == std::string_view::npos) break;
    chunks.push_back(text.substr(start, cut - start));
    start = cut;
  }
  if (start < text.size()) chunks.push_back(text.substr(start));
  return chunks;
}

Result<TokenizeSummary> tokenize_to_shards(const TokenizeOptions& o, const Tokenizer& tok) {
  if (o.shard_tokens < 1)
    return error("tokenize: --shard-tokens must be positive, got " +
                 std::to_string(o.shard_tokens));
  if (o.val_tokens < 0 && !(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    return error("tokenize: val fraction " + std::to_string(o.val_fraction) + " is outside [0, 1)",
                 "pass e.g. 0.05 to keep the last 5% of the tokens for validation");
  TS_ASSIGN_OR_RETURN(CorpusReader reader, CorpusReader::open(o.inputs, o.corpus, tok));

  StagingGuard guard;
  std::error_code ec;
  guard.out = o.out;
  guard.created_out = !fs::exists(o.out, ec);
  fs::create_directories(o.out, ec);
  if (ec || !fs::is_directory(o.out))
    return error("tokenize: cannot create output directory '" + o.out + "'" +
                     (ec ? ": " + ec.message() : std::string(" (a file is there)")),
                 "choose a writable output directory");
  // Staging folders of runs that were killed (their process is gone) go.
  for (const fs::directory_entry& e : fs::directory_iterator(o.out, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kStagingPrefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + kStagingPrefix.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      fs::remove_all(e.path(), ec);
  }
  guard.staging =
      (fs::path(o.out) / (std::string(kStagingPrefix) + std::to_string(::getpid()))).string();
  fs::remove_all(guard.staging, ec);
  fs::create_directories(guard.staging, ec);
  if (ec)
    return error("tokenize: cannot create '" + guard.staging + "': " + ec.message(),
                 "choose a writable output directory");

  TokenizeSummary sum;
  sum.threads = o.threads > 0 ? o.threads
                              : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  auto t0 = std::chrono::steady_clock::now();
  ShardSink sink(guard.staging, o.shard_tokens, tok.vocab_size());
  TS_RETURN_IF_ERROR(encode_corpus(reader, tok, sum.threads, &sink, &sum.bytes));
  TS_RETURN_IF_ERROR(sink.flush());
  for (const CorpusSource& s : reader.sources()) sum.documents += s.documents;
  sum.tokens = sink.total();
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // The validation split: the last tokens.
  const std::string what =
      o.inputs.size() == 1 ? "'" + o.inputs[0] + "'" : std::to_string(o.inputs.size()) + " inputs";
  const int64_t val = o.val_tokens >= 0
                          ? o.val_tokens
                          : static_cast<int64_t>(std::floor(o.val_fraction * double(sum.tokens)));
  if (sum.tokens == 0)
    return error("tokenize: " + what + " holds no text to tokenize (0 tokens)",
                 "pass non-empty UTF-8 text or JSONL");
  const int64_t train = sum.tokens - val;
  const bool wants_val = o.val_tokens >= 0 ? o.val_tokens > 0 : o.val_fraction > 0;
  if (train < kMinSplitTokens || (wants_val && val < kMinSplitTokens)) {
    const std::string split = o.val_tokens >= 0 ? "--val-tokens " + std::to_string(o.val_tokens)
                                                : "val fraction " + format_fixed(o.val_fraction, 3);
    return error("tokenize: " + what + " gives " + format_count(sum.tokens) +
                     " tokens: " + format_count(std::max<int64_t>(train, 0)) +
                     " for training and " + format_count(val) + " for validation (" + split +
                     "); each split needs at least " + std::to_string(kMinSplitTokens),
                 sum.tokens < 2 * kMinSplitTokens
                     ? std::string("use a longer text")
                     : "choose a validation split that leaves both splits " +
                           std::to_string(kMinSplitTokens) + " tokens or more");
  }
  std::vector<Shard> train_shards = std::move(sink.shards());
  TS_ASSIGN_OR_RETURN(std::vector<Shard> val_shards,
                      carve_val(&train_shards, val, tok.vocab_size(), guard.staging));
  if (val_shards.empty()) {  // a run without validation still has a (empty) val shard
    const std::string p = (fs::path(guard.staging) / "val_empty.bin").string();
    TS_RETURN_IF_ERROR(write_token_shard(p, {}, tok.vocab_size()));
    val_shards.push_back({p, 0});
  }

  TS_RETURN_IF_ERROR(
      commit_shards(o.out, guard.staging, tok, reader.sources(), train_shards, val_shards, &sum));
  sum.train_tokens = train;
  sum.val_tokens = val;
  TS_LOG(info) << "tokenized " << what << ": " << format_bytes(double(sum.bytes)) << ", "
               << sum.documents << " document(s), " << format_count(sum.tokens) << " tokens in "
               << format_duration(sum.seconds) << " on " << sum.threads << " thread(s) -> " << o.out
               << " (" << sum.train_shards.size() << " train shard(s), " << format_count(train)
               << " tokens; " << sum.val_shards.size() << " val shard(s), " << format_count(val)
               << ")";
  return sum;
}

Status tokenize_corpus(const std::string& text_path, const std::string& out_dir,
                       double val_fraction, const Tokenizer& tokenizer) {
  TokenizeOptions o;
  o.inputs = {text_path};
  o.corpus.format = CorpusFormat::text;
  o.out = out_dir;
  o.val_fraction = val_fraction;
  o.shard_tokens = int64_t{1} << 40;  // one shard per split
  return tokenize_to_shards(o, tokenizer).status();
}

}  // namespace tessera
