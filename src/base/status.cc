#include "base/status.h"

namespace tessera {

Status Status::error(std::string message, std::string hint) {
  Status s;
  s.error_ = true;
  s.message_ = std::move(message);
  s.hint_ = std::move(hint);
  return s;
}

Status Status::reported_elsewhere(std::string message) {
  Status s = error(std::move(message));
  s.reported_ = true;
  return s;
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  if (hint_.empty()) return message_;
  return message_ + "\nHINT: " + hint_;
}

Status Status::with_context(const std::string& context) const {
  if (ok()) return *this;
  Status s = *this;
  s.message_ = context + ": " + message_;
  return s;
}

}  // namespace tessera
