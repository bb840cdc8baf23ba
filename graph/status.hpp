// Status and StatusOr: how every library function reports failure.
//
// The library never throws. A Status carries a code and a message that names the
// op, the port and the rule that failed; StatusOr<T> carries a value or a Status.
// The two macros below are the only macros used for error propagation.
#pragma once

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace normgrad {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // the caller's graph, tensor or option is wrong
  kInvalidGraph,      // the graph is structurally broken (cycles, dangling ids, ...)
  kUnimplemented,     // valid, but this backend or build cannot run it
  kOutOfRange,        // a size or limit is exceeded
  kNotFound,          // a file, tensor or backend does not exist
  kInternal,          // a bug or a failure inside a dependency
  kDeadlineExceeded,  // a collective's processes did not all join in time
  kAborted,           // another process of a collective failed
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: <message>", or "ok".
  std::string to_string() const;
  // Prefixes the message with context, e.g. the JSON location or the op name.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() {
  return Status();
}
inline Status invalid_argument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status invalid_graph(std::string m) {
  return Status(StatusCode::kInvalidGraph, std::move(m));
}
inline Status unimplemented(std::string m) {
  return Status(StatusCode::kUnimplemented, std::move(m));
}
inline Status out_of_range(std::string m) {
  return Status(StatusCode::kOutOfRange, std::move(m));
}
inline Status not_found(std::string m) {
  return Status(StatusCode::kNotFound, std::move(m));
}
inline Status internal_error(std::string m) {
  return Status(StatusCode::kInternal, std::move(m));
}
inline Status deadline_exceeded(std::string m) {
  return Status(StatusCode::kDeadlineExceeded, std::move(m));
}
inline Status aborted(std::string m) {
  return Status(StatusCode::kAborted, std::move(m));
}

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    assert(!status_.ok() && "StatusOr built from an OK status needs a value");
    if (status_.ok()) status_ = internal_error("StatusOr constructed from OK status without value");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  // value() on an error is a programming error: it aborts with the message
  // in every build (release included), never returns garbage.
  const T& value() const& {
    if (!ok()) die();
    return *value_;
  }
  T& value() & {
    if (!ok()) die();
    return *value_;
  }
  T&& value() && {
    if (!ok()) die();
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  [[noreturn]] void die() const {
    std::fprintf(stderr, "normgrad: value() on a failed StatusOr: %s\n",
                 status_.to_string().c_str());
    std::abort();
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace normgrad

#define NG_CONCAT_INNER(a, b) a##b
#define NG_CONCAT(a, b) NG_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` is not OK.
#define NG_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::normgrad::Status ng_status_ = (expr);  \
    if (!ng_status_.ok()) return ng_status_; \
  } while (false)

// `NG_ASSIGN_OR_RETURN(auto x, f());` unwraps a StatusOr or returns its Status.
#define NG_ASSIGN_OR_RETURN(lhs, expr) \
  NG_ASSIGN_OR_RETURN_IMPL(NG_CONCAT(ng_statusor_, __LINE__), lhs, expr)
#define NG_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
