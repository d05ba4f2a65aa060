// Errors as values. A user mistake (bad config, corrupt file, out-of-range token) returns a
// Status whose message names the thing (file and key, op and shapes) and a hint; the CLI
// prints it in one paragraph and exits non-zero. Bugs use TS_CHECK (check.h) instead.
//
//   Result<Config> r = load_config(path);
//   if (!r.ok()) return r.status().with_context("loading model");
//   Config cfg = std::move(r).value();
//
//   TS_RETURN_IF_ERROR(write_file(path, bytes));
//   TS_ASSIGN_OR_RETURN(auto cfg, load_config(path));
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace tessera {

class Status {
 public:
  Status() = default;  // OK
  static Status ok_status() { return Status(); }
  static Status error(std::string message, std::string hint = {});
  // An error another process of the job has already reported (a rank that stops because
  // another could not start): the CLI exits non-zero without printing it again.
  static Status reported_elsewhere(std::string message);

  bool ok() const { return !error_; }
  bool reported() const { return reported_; }
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }
  // "message\nHINT: hint" (or just the message when there is no hint).
  std::string to_string() const;
  // Prefixes the message with "context: ". A no-op on OK.
  Status with_context(const std::string& context) const;

 private:
  bool error_ = false;
  bool reported_ = false;
  std::string message_;
  std::string hint_;
};

inline Status error(std::string message, std::string hint = {}) {
  return Status::error(std::move(message), std::move(hint));
}

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: must be an error
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace tessera

#define TS_CONCAT_INNER(a, b) a##b
#define TS_CONCAT(a, b) TS_CONCAT_INNER(a, b)

#define TS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::tessera::Status ts_status_ = (expr);   \
    if (!ts_status_.ok()) return ts_status_; \
  } while (0)

#define TS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

#define TS_ASSIGN_OR_RETURN(lhs, expr) \
  TS_ASSIGN_OR_RETURN_IMPL(TS_CONCAT(ts_result_, __LINE__), lhs, expr)
