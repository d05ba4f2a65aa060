// Invariant checks: a false condition is a bug in Tessera, not a user mistake. On failure
// they print the expression, the operand values, file:line and the rank, then abort.
//
//   TS_CHECK(node.inputs.size() == 2) << "op " << op_name(node.op);
//   TS_CHECK_EQ(a.numel(), b.numel());
#pragma once

#include <sstream>
#include <string>

namespace tessera {

// The rank printed by failed checks and log lines; -1 in single-process runs.
void set_process_rank(int rank);
int process_rank();

namespace detail {
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const std::string& what);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return out_; }

 private:
  std::ostringstream out_;
};

template <typename A, typename B>
std::string check_operands(const A& a, const B& b) {
  std::ostringstream s;
  s << " (" << a << " vs " << b << ")";
  return s.str();
}
}  // namespace detail
}  // namespace tessera

#define TS_CHECK(cond) \
  if (cond) {          \
  } else               \
    ::tessera::detail::CheckFailure(__FILE__, __LINE__, "TS_CHECK(" #cond ")").stream()

#define TS_CHECK_OP(a, b, op)                                                            \
  if ((a)op(b)) {                                                                        \
  } else                                                                                 \
    ::tessera::detail::CheckFailure(                                                     \
        __FILE__, __LINE__,                                                              \
        "TS_CHECK(" #a " " #op " " #b ")" + ::tessera::detail::check_operands((a), (b))) \
        .stream()

#define TS_CHECK_EQ(a, b) TS_CHECK_OP(a, b, ==)
#define TS_CHECK_NE(a, b) TS_CHECK_OP(a, b, !=)
#define TS_CHECK_LT(a, b) TS_CHECK_OP(a, b, <)
#define TS_CHECK_LE(a, b) TS_CHECK_OP(a, b, <=)
#define TS_CHECK_GT(a, b) TS_CHECK_OP(a, b, >)
#define TS_CHECK_GE(a, b) TS_CHECK_OP(a, b, >=)
