// Reading TOML configs with errors a user can act on. A TomlTable is a parsed toml++
// table that remembers the file it came from and its own dotted position in that file.
//
//   TS_ASSIGN_OR_RETURN(TomlTable cfg, parse_toml_file("configs/gpt2.toml"));
//   TS_ASSIGN_OR_RETURN(TomlTable model, cfg.table("model"));        // [model]
//   TS_RETURN_IF_ERROR(model.check_no_unknown_keys({"n_layer", "n_head", "d_model"}));
//   TS_ASSIGN_OR_RETURN(int64_t n_head, model.require_int("n_head"));
//   TS_ASSIGN_OR_RETURN(double lr, cfg.get_float("optim.lr", 3e-4));   // dotted key
//   TS_ASSIGN_OR_RETURN(std::string act, model.get_choice("act", {"gelu", "relu"}, "gelu"));
//
// Failure behaviour: nothing throws. Errors read
//   configs/gpt2.toml:7: key 'model.n_head' must be an integer, got string "12"
// i.e. file, line (when toml++ knows it), the full dotted key, what was expected and what
// was found, plus a hint. Syntax errors give file:line:column and the parser's text.
// get_* return the default when the key is absent; require_* return an error then.
// A present key of the wrong type is always an error (it is never silently defaulted).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera {

class TomlTable {
 public:
  TomlTable();  // an empty table named "<empty>"

  // The file path (or name given to parse_toml_string).
  const std::string& source() const { return source_; }
  // Dotted path of this table inside the document ("" for the root, "model" for [model]).
  const std::string& prefix() const { return prefix_; }
  // Keys of this table, in the order they appear in the source.
  std::vector<std::string> keys() const;
  // `key` may be dotted ("optim.lr") to reach into sub-tables.
  bool has(const std::string& key) const;

  Result<int64_t> get_int(const std::string& key, int64_t default_value) const;
  // Accepts integers too ("lr = 1" reads as 1.0).
  Result<double> get_float(const std::string& key, double default_value) const;
  Result<std::string> get_string(const std::string& key, std::string default_value) const;
  Result<bool> get_bool(const std::string& key, bool default_value) const;
  Result<std::vector<int64_t>> get_int_array(const std::string& key,
                                             std::vector<int64_t> default_value) const;
  Result<std::vector<std::string>> get_string_array(const std::string& key,
                                                    std::vector<std::string> default_value) const;

  Result<int64_t> require_int(const std::string& key) const;
  Result<double> require_float(const std::string& key) const;
  Result<std::string> require_string(const std::string& key) const;
  Result<bool> require_bool(const std::string& key) const;

  // A string that must be one of `accepted`; the error lists them (and suggests the
  // closest). The default is not checked against `accepted`.
  Result<std::string> get_choice(const std::string& key, const std::vector<std::string>& accepted,
                                 std::string default_value) const;

  // The sub-table at `key` (dotted allowed). Absent -> an empty table (so defaults apply);
  // present but not a table -> error. require_table errors when absent too.
  Result<TomlTable> table(const std::string& key) const;
  Result<TomlTable> require_table(const std::string& key) const;
  // The tables of an array of tables (`[[key]]` sections), in order; absent -> none.
  Result<std::vector<TomlTable>> table_array(const std::string& key) const;

  // Error naming every key of this table not in `known` (with a did-you-mean for the
  // first) and listing the accepted keys.
  Status check_no_unknown_keys(const std::vector<std::string>& known) const;

  // "FILE:LINE: key 'model.n_head' <what>" for callers' own checks (ranges, consistency).
  Status error_at(const std::string& key, const std::string& what,
                  const std::string& hint = {}) const;

  // Opaque to keep toml++ out of this header.
  struct Doc;

 private:
  friend Result<TomlTable> parse_toml_string(const std::string& text, const std::string& name);
  TomlTable(std::shared_ptr<const Doc> doc, const void* table, std::string prefix);

  template <typename T>
  Result<T> get_or(const std::string& key, T default_value) const;
  template <typename T>
  Result<T> require(const std::string& key) const;
  // Finds `key` (dotted); null if absent. Errors if a dotted component is not a table.
  Result<const void*> lookup(const std::string& key) const;
  std::string full_key(const std::string& key) const;
  std::string location(const void* node) const;  // "FILE:LINE" or "FILE"

  std::shared_ptr<const Doc> doc_;
  const void* table_ = nullptr;  // const toml::table*, owned by doc_
  std::string source_;
  std::string prefix_;
};

// Syntax errors -> "FILE:LINE:COL: TOML syntax error: DESCRIPTION".
Result<TomlTable> parse_toml_file(const std::string& path);
Result<TomlTable> parse_toml_string(const std::string& text, const std::string& name);

// ---- Suggestions (also used by other io/ messages) -------------------------------------

// Edit distance counting adjacent transpositions as one edit (optimal string alignment).
int edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `word` if it is close enough to be a likely typo (distance at
// most max(1, |word| / 3)); "" otherwise.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);
// "a, b, c"
std::string join_strings(const std::vector<std::string>& items, const std::string& sep = ", ");

}  // namespace tessera
