#include "data/tokenizer.h"

#include <filesystem>
#include <queue>

#include "base/check.h"
#include "data/tokenizer_impl.h"

namespace tessera {
namespace {

// Pieces cached at most (dropped when it grows past this; a few hundred MB of text has far
// fewer distinct pieces), and the longest piece cached.
constexpr size_t kMaxCacheEntries = size_t{1} << 18;
constexpr size_t kMaxCachedPiece = 256;

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 "▁"

// Merges `sym` in place: repeatedly the adjacent pair of lowest merge rank, the leftmost of
// equal ranks, until no adjacent pair merges (what GPT-2's bpe() and Hugging Face's BPE do).
// A heap over the pairs and a linked list over the symbols: O(n log n) for a piece of n
// symbols, so a SentencePiece document encoded whole is no quadratic walk.
void merge_symbols(const Tokenizer::Impl& m, std::vector<int32_t>* sym) {
  const int n = static_cast<int>(sym->size());
  if (n < 2) return;
  std::vector<int32_t>& s = *sym;
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  struct Candidate {
    int32_t rank;
    int pos;  // the left symbol
    int32_t left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = m.merges.find(bpe_pair_key(s[pos], s[next[pos]]));
    if (it != m.merges.end()) heap.push({it->second.rank, pos, s[pos], s[next[pos]]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> dead(n, false);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    const int r = next[c.pos];
    if (dead[c.pos] || r < 0 || s[c.pos] != c.left || s[r] != c.right) continue;  // stale
    s[c.pos] = m.merges.at(bpe_pair_key(c.left, c.right)).merged;
    dead[r] = true;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  int w = 0;
  for (int i = 0; i >= 0; i = next[i]) s[w++] = s[i];
  s.resize(w);
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return load_hf_tokenizer(path);
  if (!fs::is_directory(path, ec))
    return error("tokenizer '" + path + "' does not exist",
                 "pass a Hugging Face tokenizer.json, the model folder holding it, or a folder "
                 "with GPT-2's encoder.json and vocab.bpe (the repository's data/gpt2)");
  if (fs::exists(fs::path(path) / "tokenizer.json"))
    return load_hf_tokenizer((fs::path(path) / "tokenizer.json").string());
  if (fs::exists(fs::path(path) / "encoder.json") || fs::exists(fs::path(path) / "vocab.bpe"))
    return load_gpt2_tokenizer(path);
  std::string hint = "pass a folder with a tokenizer.json (a Hugging Face model folder)";
  if (fs::exists(fs::path(path) / "tokenizer.model"))
    hint =
        "this folder has only SentencePiece's tokenizer.model; Tessera reads the "
        "tokenizer.json that Hugging Face ships beside it (transformers' "
        "AutoTokenizer.from_pretrained(...).save_pretrained(DIR) writes one)";
  return error("folder '" + path + "' holds no tokenizer.json (nor GPT-2's encoder.json)", hint);
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
  const Impl& m = *impl_;
  if (m.ignore_merges) {
    auto it = m.id_of.find(piece);
    if (it != m.id_of.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (m.alphabet == Impl::Alphabet::bytes && piece.size() == 1) {
    out->push_back(m.byte_token[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const bool cacheable = piece.size() <= kMaxCachedPiece;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(impl_->cache_mu);
    auto it = impl_->cache.find(piece);
    if (it != impl_->cache.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> word;
  word.reserve(piece.size());
  if (m.alphabet == Impl::Alphabet::bytes) {
    for (char c : piece) word.push_back(m.byte_token[static_cast<unsigned char>(c)]);
  } else {
    for (size_t pos = 0; pos < piece.size();) {
      size_t len = 0;
      if (decode_utf8(piece, pos, &len) < 0) len = 1;  // an invalid byte: its byte token
      auto it = m.id_of.find(piece.substr(pos, len));
      if (it != m.id_of.end()) {
        word.push_back(it->second);
      } else if (m.byte_fallback) {
        for (size_t k = 0; k < len; ++k)
          word.push_back(m.byte_token[static_cast<unsigned char>(piece[pos + k])]);
      } else if (!(m.fuse_unk && !word.empty() && word.back() == m.unk)) {
        word.push_back(m.unk);
      }
      pos += len;
    }
  }
  merge_symbols(m, &word);
  out->insert(out->end(), word.begin(), word.end());
  if (!cacheable) return;
  std::lock_guard<std::mutex> lock(impl_->cache_mu);
  if (impl_->cache.size() >= kMaxCacheEntries) impl_->cache.clear();
  impl_->cache.emplace(std::string(piece), std::move(word));
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>* out,
                              bool document_start) const {
  const Impl& m = *impl_;
  if (text.empty()) return;
  std::string normalized;
  if (m.alphabet == Impl::Alphabet::sentencepiece) {
    normalized.reserve(text.size() + text.size() / 4 + 3);
    if (document_start && m.spm_prepend && !(m.spm_prepend_unless_space && text[0] == ' '))
      normalized += kMetaspace;
    for (char c : text) {
      if (c == ' ')
        normalized += kMetaspace;
      else
        normalized += c;
    }
    text = normalized;
  } else if (document_start && m.add_prefix_space && text[0] != ' ') {
    normalized = " ";
    normalized += text;
    text = normalized;
  }
  if (m.alphabet == Impl::Alphabet::sentencepiece && (m.spm_split || m.spm_words)) {
    // A piece starts at every "▁" (Metaspace's split), or at every "▁" after another
    // character (spm_words).
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find(kMetaspace, start + 1);
      while (m.spm_words && end != std::string_view::npos && end >= kMetaspace.size() &&
             text.compare(end - kMetaspace.size(), kMetaspace.size(), kMetaspace) == 0)
        end = text.find(kMetaspace, end + 1);
      if (end == std::string_view::npos) end = text.size();
      encode_piece(text.substr(start, end - start), out);
      start = end;
    }
    return;
  }
  for (size_t pos = 0; pos < text.size();) {
    size_t len = next_piece(m.pre, text, pos);
    encode_piece(text.substr(pos, len), out);
    pos += len;
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  encode_append(text, &ids);
  return ids;
}

bool Tokenizer::can_cut_before(std::string_view text, size_t pos) const {
  const Impl& m = *impl_;
  if (pos == 0 || pos >= text.size()) return false;
  // A line break: '\n', or the "\r\n" of a CRLF line (both are \s to the regexes).
  const bool crlf = text[pos] == '\r' && pos + 1 < text.size() && text[pos + 1] == '\n';
  if (text[pos] != '\n' && !crlf) return false;
  const unsigned char before = static_cast<unsigned char>(text[pos - 1]);
  if (m.alphabet == Impl::Alphabet::sentencepiece)  // not inside a run of line breaks
    return !crlf && m.newline_is_barrier && !m.ignore_merges && before != '\n' && before != '\r';
  switch (m.pre) {
    case Pretokenizer::gpt2:  // no piece but \s+ runs holds a '\n'; none ends on a symbol
      return before > ' ' && before < 0x7F;
    case Pretokenizer::llama3:  // symbols take the line breaks after them; letters do not
      return (before >= '0' && before <= '9') || (before >= 'A' && before <= 'Z') ||
             (before >= 'a' && before <= 'z');
    case Pretokenizer::none:
      break;
  }
  return false;
}

size_t Tokenizer::next_cut(std::string_view text, size_t from, size_t end) const {
  for (size_t nl = text.find('\n', from); nl < end; nl = text.find('\n', nl + 1)) {
    if (nl > from && text[nl - 1] == '\r' && can_cut_before(text, nl - 1)) return nl - 1;
    if (can_cut_before(text, nl)) return nl;
  }
  return std::string_view::npos;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  TS_CHECK(id >= 0 && id < vocab_size())
      << "token id " << id << " outside " << impl_->name << "'s vocabulary of " << vocab_size();
  return impl_->token_bytes[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool document_start) const {
  std::string text;
  for (int32_t id : ids)
    text += id >= 0 && id < vocab_size() ? impl_->token_bytes[id] : "\xEF\xBF\xBD";
  // SentencePiece's decoders strip the space its normalizer put before the document.
  if (document_start && impl_->spm_prepend && !text.empty() && text[0] == ' ') text.erase(0, 1);
  return text;
}

int Tokenizer::vocab_size() const { return static_cast<int>(impl_->token_bytes.size()); }
int32_t Tokenizer::document_start() const { return impl_->bos >= 0 ? impl_->bos : impl_->eos; }
int32_t Tokenizer::eos() const { return impl_->eos; }
int32_t Tokenizer::bos() const { return impl_->bos; }
const std::string& Tokenizer::name() const { return impl_->name; }
const std::vector<std::string>& Tokenizer::files() const { return impl_->files; }

Status Tokenizer::copy_to(const std::string& dir) const {
  namespace fs = std::filesystem;
  if (impl_->name == "gpt2") return Status();
  std::error_code ec;
  for (const std::string& f : impl_->files) {
    const fs::path to = fs::path(dir) / fs::path(f).filename();
    if (fs::exists(to, ec) && fs::equivalent(f, to, ec)) continue;
    fs::copy_file(f, to, fs::copy_options::overwrite_existing, ec);
    if (ec)
      return error(
          "cannot copy the tokenizer file '" + f + "' to '" + to.string() + "': " + ec.message(),
          "check that the folder is writable");
  }
  return Status();
}

std::string find_tokenizer_near(const std::string& dir, int levels) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  for (int up = 0; up <= levels && !p.empty(); ++up, p = p.parent_path()) {
    if (fs::exists(p / "tokenizer.json", ec)) return (p / "tokenizer.json").string();
    if (p == p.parent_path()) break;
  }
  return "";
}

}  // namespace tessera
