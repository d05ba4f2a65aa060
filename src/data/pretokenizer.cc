#include "data/pretokenizer.h"

#include <algorithm>
#include <array>

namespace tessera {
namespace {

struct ClassRange {
  uint32_t first;
  uint32_t last;
  uint8_t cls;
};

constexpr ClassRange kClassRanges[] = {
#include "data/unicode_classes.inc"
};

// The BMP is looked up in a 64 KiB table built once; the rest by binary search over ranges.
struct BmpTable {
  std::array<uint8_t, 0x10000> cls{};
  BmpTable() {
    for (const ClassRange& r : kClassRanges) {
      if (r.first > 0xFFFF) break;
      uint32_t last = std::min<uint32_t>(r.last, 0xFFFF);
      for (uint32_t cp = r.first; cp <= last; ++cp) cls[cp] = r.cls;
    }
  }
};

const BmpTable& bmp_table() {
  static const BmpTable table;
  return table;
}

constexpr bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Class of the code point at `pos`; sets *len. Invalid bytes are `other`.
CharClass class_at(std::string_view text, size_t pos, size_t* len) {
  int32_t cp = decode_utf8(text, pos, len);
  return cp < 0 ? CharClass::other : char_class(static_cast<uint32_t>(cp));
}

// End of the run of code points of class `cls` that starts at `pos`.
size_t run_end(std::string_view text, size_t pos, CharClass cls) {
  while (pos < text.size()) {
    size_t len = 0;
    if (class_at(text, pos, &len) != cls) break;
    pos += len;
  }
  return pos;
}

// Length of a contraction ('s 't 're 've 'm 'll 'd; lowercase only, as in GPT-2) at pos.
size_t contraction_length(std::string_view text, size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  char c1 = text[pos + 1];
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 >= text.size()) return 0;
  char c2 = text[pos + 2];
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// Length of a contraction matched case-insensitively (Llama 3: 'S, 'Re, 'LL ...) at pos.
size_t contraction_length_any_case(std::string_view text, size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
  char c1 = lower(text[pos + 1]);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 >= text.size()) return 0;
  char c2 = lower(text[pos + 2]);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

bool is_cr_or_lf(std::string_view text, size_t pos) {
  return text[pos] == '\r' || text[pos] == '\n';
}

}  // namespace

CharClass char_class(uint32_t code_point) {
  if (code_point <= 0xFFFF) return static_cast<CharClass>(bmp_table().cls[code_point]);
  const ClassRange* end = std::end(kClassRanges);
  const ClassRange* it =
      std::upper_bound(std::begin(kClassRanges), end, code_point,
                       [](uint32_t cp, const ClassRange& r) { return cp < r.first; });
  if (it == std::begin(kClassRanges)) return CharClass::other;
  --it;
  return code_point <= it->last ? static_cast<CharClass>(it->cls) : CharClass::other;
}

int32_t decode_utf8(std::string_view text, size_t pos, size_t* len) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size();
  unsigned char c0 = s[pos];
  *len = 1;
  if (c0 < 0x80) return c0;
  size_t need;
  uint32_t cp;
  uint32_t min_cp;
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    need = 1, cp = c0 & 0x1F, min_cp = 0x80;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    need = 2, cp = c0 & 0x0F, min_cp = 0x800;
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    need = 3, cp = c0 & 0x07, min_cp = 0x10000;
  } else {
    return -1;  // continuation byte, C0/C1 (always overlong) or F5..FF
  }
  for (size_t k = 1; k <= need; ++k) {
    if (pos + k >= n || !is_continuation(s[pos + k])) return -1;
    cp = (cp << 6) | (s[pos + k] & 0x3F);
  }
  if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
  *len = need + 1;
  return static_cast<int32_t>(cp);
}

size_t gpt2_next_piece(std::string_view text, size_t pos) {
  const size_t n = text.size();
  // 's|'t|'re|'ve|'m|'ll|'d
  if (size_t c = contraction_length(text, pos)) return c;

  size_t len0 = 0;
  CharClass c0 = class_at(text, pos, &len0);
  size_t body = pos;  // where the class run starts (after an optional leading ' ')
  CharClass body_class = c0;
  if (text[pos] == ' ' && pos + 1 < n) {
    size_t len1 = 0;
    CharClass c1 = class_at(text, pos + 1, &len1);
    if (c1 != CharClass::space) body = pos + 1, body_class = c1;
  }
  //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+
  if (body_class != CharClass::space) return run_end(text, body, body_class) - pos;

  // \s+(?!\S) | \s+ : the whitespace run, less its last code point when a non-space follows
  // (that code point then leads the next piece, e.g. " world"), unless the run is one long.
  size_t end = pos;
  size_t last_len = 0;
  while (end < n) {
    size_t len = 0;
    if (class_at(text, end, &len) != CharClass::space) break;
    end += len;
    last_len = len;
  }
  if (end == n) return end - pos;
  if (end - pos > last_len) return end - last_len - pos;
  return end - pos;
}

size_t llama3_next_piece(std::string_view text, size_t pos) {
  const size_t n = text.size();
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (size_t c = contraction_length_any_case(text, pos)) return c;

  size_t len0 = 0;
  CharClass c0 = class_at(text, pos, &len0);
  // [^\r\n\p{L}\p{N}]?\p{L}+ : letters, after at most one code point that is neither a
  // letter, a number nor a line break.
  if (c0 == CharClass::letter) return run_end(text, pos, CharClass::letter) - pos;
  const bool may_lead = c0 != CharClass::number && !is_cr_or_lf(text, pos);
  if (may_lead && pos + len0 < n) {
    size_t len1 = 0;
    if (class_at(text, pos + len0, &len1) == CharClass::letter)
      return run_end(text, pos + len0, CharClass::letter) - pos;
  }
  // \p{N}{1,3}
  if (c0 == CharClass::number) {
    size_t end = pos;
    for (int k = 0; k < 3 && end < n; ++k) {
      size_t len = 0;
      if (class_at(text, end, &len) != CharClass::number) break;
      end += len;
    }
    return end - pos;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]* : symbols (after an optional space), then any line breaks.
  size_t body = pos;
  if (text[pos] == ' ' && pos + 1 < n) {
    size_t len1 = 0;
    if (class_at(text, pos + 1, &len1) == CharClass::other) body = pos + 1;
  }
  size_t len_body = 0;
  if (class_at(text, body, &len_body) == CharClass::other) {
    size_t end = run_end(text, body, CharClass::other);
    while (end < n && is_cr_or_lf(text, end)) ++end;
    return end - pos;
  }
  // Whitespace from here: the run [pos, end) and where its last line break ends.
  size_t end = pos;
  size_t last_len = 0;
  size_t after_break = 0;  // 0: no \r or \n in the run
  while (end < n) {
    size_t len = 0;
    if (class_at(text, end, &len) != CharClass::space) break;
    if (is_cr_or_lf(text, end)) after_break = end + 1;
    end += len;
    last_len = len;
  }
  // \s*[\r\n]+ : the run up to its last line break.
  if (after_break != 0) return after_break - pos;
  // \s+(?!\S) | \s+ : as GPT-2's.
  if (end == n) return end - pos;
  if (end - pos > last_len) return end - last_len - pos;
  return end - pos;
}

size_t next_piece(Pretokenizer kind, std::string_view text, size_t pos) {
  switch (kind) {
    case Pretokenizer::gpt2:
      return gpt2_next_piece(text, pos);
    case Pretokenizer::llama3:
      return llama3_next_piece(text, pos);
    case Pretokenizer::none:
      break;
  }
  return text.size() - pos;
}

std::vector<std::string_view> pretokenize(Pretokenizer kind, std::string_view text) {
  std::vector<std::string_view> pieces;
  for (size_t pos = 0; pos < text.size();) {
    size_t len = next_piece(kind, text, pos);
    pieces.push_back(text.substr(pos, len));
    pos += len;
  }
  return pieces;
}

}  // namespace tessera
