#include "io/toml_config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>

#include "base/check.h"
#include "io/fs.h"

namespace tessera {

struct TomlTable::Doc {
  toml::table root;
};

namespace {

const toml::table& as_table(const void* p) { return *static_cast<const toml::table*>(p); }
const toml::node& as_node(const void* p) { return *static_cast<const toml::node*>(p); }

const toml::table& empty_table() {
  static const toml::table* t = new toml::table();
  return *t;
}

std::vector<std::string> split_dots(const std::string& key) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

std::string quote(std::string_view s) {
  std::string out = "\"";
  if (s.size() > 60) {
    out.append(s.substr(0, 57));
    out += "...";
  } else {
    out.append(s);
  }
  return out + "\"";
}

std::string format_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// "string \"12\"", "integer 12", "float 0.5", "boolean true", "array", "table", ...
std::string describe(const toml::node& n) {
  if (auto s = n.as_string()) return "string " + quote(s->get());
  if (auto i = n.as_integer()) return "integer " + std::to_string(i->get());
  if (auto f = n.as_floating_point()) return "float " + format_double(f->get());
  if (auto b = n.as_boolean()) return std::string("boolean ") + (b->get() ? "true" : "false");
  if (n.is_array()) return "array";
  if (n.is_table()) return "table";
  if (n.is_date()) return "date";
  if (n.is_time()) return "time";
  if (n.is_date_time()) return "date-time";
  return "value";
}

bool parses_as_int(std::string_view s) {
  int64_t v;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

bool parses_as_float(std::string_view s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::string str(s);
  std::strtod(str.c_str(), &end);
  return end == str.c_str() + str.size();
}

std::string last_component(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

enum class Want { integer, floating, string, boolean };

const char* want_name(Want w) {
  switch (w) {
    case Want::integer:
      return "an integer";
    case Want::floating:
      return "a number";
    case Want::string:
      return "a string";
    case Want::boolean:
      return "a boolean (true or false)";
  }
  return "?";
}

std::string type_hint(Want want, const toml::node& n, const std::string& key) {
  const std::string k = last_component(key);
  if (auto s = n.as_string()) {
    const std::string& v = s->get();
    if ((want == Want::integer && parses_as_int(v)) ||
        (want == Want::floating && parses_as_float(v)) ||
        (want == Want::boolean && (v == "true" || v == "false"))) {
      return "remove the quotes: " + k + " = " + v;
    }
  }
  if (want == Want::integer && n.is_floating_point()) {
    return "write a whole number without a decimal point, e.g. " + k + " = 12";
  }
  switch (want) {
    case Want::integer:
      return "write an integer, e.g. " + k + " = 12";
    case Want::floating:
      return "write a number, e.g. " + k + " = 0.5";
    case Want::string:
      return "put the value in quotes, e.g. " + k + " = \"text\"";
    case Want::boolean:
      return "write " + k + " = true or " + k + " = false";
  }
  return {};
}

template <typename T>
std::optional<T> convert(const toml::node& n, Want want) {
  if constexpr (std::is_same_v<T, int64_t>) {
    if (auto i = n.as_integer()) return i->get();
  } else if constexpr (std::is_same_v<T, double>) {
    if (auto f = n.as_floating_point()) return f->get();
    if (auto i = n.as_integer()) return static_cast<double>(i->get());
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (auto s = n.as_string()) return s->get();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (auto b = n.as_boolean()) return b->get();
  }
  return std::nullopt;
}

template <typename T>
constexpr Want want_of() {
  if constexpr (std::is_same_v<T, int64_t>) return Want::integer;
  if constexpr (std::is_same_v<T, double>) return Want::floating;
  if constexpr (std::is_same_v<T, std::string>) return Want::string;
  return Want::boolean;
}

}  // namespace

// ---- Parsing -----------------------------------------------------------------------------

Result<TomlTable> parse_toml_string(const std::string& text, const std::string& name) {
  auto doc = std::make_shared<TomlTable::Doc>();
  try {
    doc->root = toml::parse(text, std::string_view(name));
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    return error(name + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
                     ": TOML syntax error: " + std::string(e.description()),
                 "fix the syntax at line " + std::to_string(b.line) + " of " + name);
  }
  const toml::table* root = &doc->root;
  TomlTable t(std::move(doc), root, "");
  t.source_ = name;
  return t;
}

Result<TomlTable> parse_toml_file(const std::string& path) {
  Result<std::string> text = read_file(path);
  if (!text.ok()) return text.status().with_context("reading config");
  return parse_toml_string(text.value(), path);
}

// ---- TomlTable ---------------------------------------------------------------------------

TomlTable::TomlTable()
    : doc_(std::make_shared<Doc>()), table_(&empty_table()), source_("<empty>") {}

TomlTable::TomlTable(std::shared_ptr<const Doc> doc, const void* table, std::string prefix)
    : doc_(std::move(doc)), table_(table), prefix_(std::move(prefix)) {}

std::vector<std::string> TomlTable::keys() const {
  std::vector<std::pair<toml::source_position, std::string>> items;
  for (const auto& [k, v] : as_table(table_)) items.emplace_back(k.source().begin, std::string(k));
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
    if (a.first.line != b.first.line) return a.first.line < b.first.line;
    return a.first.column < b.first.column;
  });
  std::vector<std::string> out;
  for (auto& [pos, k] : items) out.push_back(std::move(k));
  return out;
}

std::string TomlTable::full_key(const std::string& key) const {
  return prefix_.empty() ? key : prefix_ + "." + key;
}

std::string TomlTable::location(const void* node) const {
  if (node) {
    const auto& b = as_node(node).source().begin;
    if (b.line > 0) return source_ + ":" + std::to_string(b.line);
  }
  return source_;
}

Status TomlTable::error_at(const std::string& key, const std::string& what,
                           const std::string& hint) const {
  const void* node = nullptr;
  Result<const void*> r = lookup(key);
  if (r.ok()) node = r.value();
  return error(location(node) + ": key '" + full_key(key) + "' " + what, hint);
}

Result<const void*> TomlTable::lookup(const std::string& key) const {
  const toml::table* t = &as_table(table_);
  std::vector<std::string> parts = split_dots(key);
  for (size_t i = 0; i < parts.size(); ++i) {
    const toml::node* n = t->get(parts[i]);
    if (!n) return static_cast<const void*>(nullptr);
    if (i + 1 == parts.size()) return static_cast<const void*>(n);
    t = n->as_table();
    if (!t) {
      std::string sub;
      for (size_t k = 0; k <= i; ++k) sub += (k ? "." : "") + parts[k];
      return error(
          location(n) + ": key '" + full_key(sub) + "' must be a table, got " + describe(*n),
          "key '" + full_key(key) + "' expects [" + full_key(sub) + "] to be a table");
    }
  }
  return static_cast<const void*>(nullptr);
}

bool TomlTable::has(const std::string& key) const {
  Result<const void*> r = lookup(key);
  return r.ok() && r.value() != nullptr;
}

namespace {

template <typename T>
Result<std::optional<T>> get_typed(const TomlTable& t, const void* node, const std::string& key) {
  if (!node) return std::optional<T>();
  const toml::node& n = as_node(node);
  std::optional<T> v = convert<T>(n, want_of<T>());
  if (!v) {
    return t.error_at(key,
                      std::string("must be ") + want_name(want_of<T>()) + ", got " + describe(n),
                      type_hint(want_of<T>(), n, key));
  }
  return v;
}

template <typename T>
Result<std::vector<T>> get_array(const TomlTable& t, const void* node, const std::string& key) {
  const toml::node& n = as_node(node);
  const toml::array* arr = n.as_array();
  const Want want = want_of<T>();
  if (!arr) {
    return t.error_at(key, "must be an array, got " + describe(n),
                      "write e.g. " + last_component(key) + " = [" +
                          (want == Want::string ? "\"a\", \"b\"" : "1, 2") + "]");
  }
  std::vector<T> out;
  for (size_t i = 0; i < arr->size(); ++i) {
    std::optional<T> v = convert<T>(*arr->get(i), want);
    if (!v) {
      return t.error_at(key,
                        "element " + std::to_string(i) + " must be " + want_name(want) + ", got " +
                            describe(*arr->get(i)),
                        type_hint(want, *arr->get(i), key));
    }
    out.push_back(std::move(*v));
  }
  return out;
}

}  // namespace

namespace {

template <typename T>
Result<std::optional<T>> lookup_typed(const TomlTable& t, Result<const void*> node,
                                      const std::string& key) {
  if (!node.ok()) return node.status();
  return get_typed<T>(t, node.value(), key);
}

}  // namespace

template <typename T>
Result<T> TomlTable::get_or(const std::string& key, T default_value) const {
  TS_ASSIGN_OR_RETURN(std::optional<T> v, lookup_typed<T>(*this, lookup(key), key));
  if (v) return std::move(*v);
  return default_value;
}

template <typename T>
Result<T> TomlTable::require(const std::string& key) const {
  TS_ASSIGN_OR_RETURN(std::optional<T> v, lookup_typed<T>(*this, lookup(key), key));
  if (v) return std::move(*v);
  return error(source_ + ": missing required key '" + full_key(key) + "'",
               std::string("add ") + last_component(key) + " = <" + want_name(want_of<T>()) +
                   "> to the config");
}

Result<int64_t> TomlTable::get_int(const std::string& key, int64_t default_value) const {
  return get_or<int64_t>(key, default_value);
}
Result<double> TomlTable::get_float(const std::string& key, double default_value) const {
  return get_or<double>(key, default_value);
}
Result<std::string> TomlTable::get_string(const std::string& key, std::string default_value) const {
  return get_or<std::string>(key, std::move(default_value));
}
Result<bool> TomlTable::get_bool(const std::string& key, bool default_value) const {
  return get_or<bool>(key, default_value);
}
Result<int64_t> TomlTable::require_int(const std::string& key) const {
  return require<int64_t>(key);
}
Result<double> TomlTable::require_float(const std::string& key) const {
  return require<double>(key);
}
Result<std::string> TomlTable::require_string(const std::string& key) const {
  return require<std::string>(key);
}
Result<bool> TomlTable::require_bool(const std::string& key) const { return require<bool>(key); }

Result<std::vector<int64_t>> TomlTable::get_int_array(const std::string& key,
                                                      std::vector<int64_t> default_value) const {
  TS_ASSIGN_OR_RETURN(const void* node, lookup(key));
  if (!node) return default_value;
  return get_array<int64_t>(*this, node, key);
}

Result<std::vector<std::string>> TomlTable::get_string_array(
    const std::string& key, std::vector<std::string> default_value) const {
  TS_ASSIGN_OR_RETURN(const void* node, lookup(key));
  if (!node) return default_value;
  return get_array<std::string>(*this, node, key);
}

Result<std::string> TomlTable::get_choice(const std::string& key,
                                          const std::vector<std::string>& accepted,
                                          std::string default_value) const {
  TS_ASSIGN_OR_RETURN(std::string v, get_string(key, default_value));
  if (!has(key) || std::find(accepted.begin(), accepted.end(), v) != accepted.end()) return v;
  std::string near = closest_match(v, accepted);
  return error_at(key,
                  "must be one of " + join_strings(accepted) + ", got " + quote(v) +
                      (near.empty() ? "" : " (did you mean \"" + near + "\"?)"),
                  "accepted values: " + join_strings(accepted));
}

Result<TomlTable> TomlTable::table(const std::string& key) const {
  TS_ASSIGN_OR_RETURN(const void* node, lookup(key));
  TomlTable out(doc_, &empty_table(), full_key(key));
  out.source_ = source_;
  if (!node) return out;
  const toml::table* t = as_node(node).as_table();
  if (!t) {
    return error_at(key, "must be a table, got " + describe(as_node(node)),
                    "write it as a section: [" + full_key(key) + "]");
  }
  out.table_ = t;
  return out;
}

Result<std::vector<TomlTable>> TomlTable::table_array(const std::string& key) const {
  TS_ASSIGN_OR_RETURN(const void* node, lookup(key));
  std::vector<TomlTable> out;
  if (!node) return out;
  const toml::array* a = as_node(node).as_array();
  if (!a || !a->is_array_of_tables())
    return error_at(key, "must be an array of tables, got " + describe(as_node(node)),
                    "write each entry as a [[" + full_key(key) + "]] section");
  for (size_t i = 0; i < a->size(); ++i) {
    TomlTable t(doc_, a->get(i)->as_table(), full_key(key) + "[" + std::to_string(i) + "]");
    t.source_ = source_;
    out.push_back(std::move(t));
  }
  return out;
}

Result<TomlTable> TomlTable::require_table(const std::string& key) const {
  if (!has(key)) {
    return error(source_ + ": missing required table [" + full_key(key) + "]",
                 "add a [" + full_key(key) + "] section to the config");
  }
  return table(key);
}

Status TomlTable::check_no_unknown_keys(const std::vector<std::string>& known) const {
  std::vector<std::string> unknown;
  for (const std::string& k : keys()) {
    if (std::find(known.begin(), known.end(), k) == known.end()) unknown.push_back(k);
  }
  if (unknown.empty()) return Status();
  const std::string where = prefix_.empty() ? "at the top level" : "in [" + prefix_ + "]";
  const toml::node* first = as_table(table_).get(unknown[0]);
  std::string near = closest_match(unknown[0], known);
  std::string msg = location(first) + ": unknown key '" + unknown[0] + "' " + where +
                    (near.empty() ? "" : " (did you mean '" + near + "'?)");
  if (unknown.size() > 1) {
    std::vector<std::string> rest(unknown.begin() + 1, unknown.end());
    msg += "; also unknown: " + join_strings(rest);
  }
  std::vector<std::string> sorted = known;
  std::sort(sorted.begin(), sorted.end());
  return error(msg, "accepted keys " + where + ": " + join_strings(sorted));
}

// ---- Suggestions -------------------------------------------------------------------------

int edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment: insertions, deletions, substitutions and transpositions of
  // adjacent characters ("gleu" -> "gelu") each cost 1.
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  const int limit = std::max<int>(1, static_cast<int>(word.size()) / 3);
  std::string best;
  int best_d = limit + 1;
  for (const std::string& c : candidates) {
    int d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string join_strings(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

}  // namespace tessera
