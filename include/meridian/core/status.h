// Errors are values: every fallible function returns a Status or a
// Result<T>. Exceptions from third-party libraries (ZeroMQ, Protobuf) are
// caught at their edge and turned into a Status.
#ifndef MERIDIAN_CORE_STATUS_H_
#define MERIDIAN_CORE_STATUS_H_

#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace meridian {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller's input is wrong (config, flags, message)
  kNotFound,            // a named file, tensor, site... does not exist
  kOutOfRange,          // an index or range outside its container
  kFailedPrecondition,  // valid request at the wrong time or state
  kDataLoss,            // corrupt or truncated bytes
  kUnavailable,         // a peer or resource cannot be reached (retryable)
  kDeadlineExceeded,    // a timeout expired
  kCancelled,           // stopped on request (signal, shutdown)
  kInternal,            // a bug: an invariant did not hold
  kResourceExhausted,   // a bounded queue or limit is full (a peer does not
                        // read, a request asks for too much)
};

std::string_view StatusCodeName(StatusCode code);

// A success or an error code with a human-readable message. Cheap to copy
// when OK. Thread-compatible.
class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is `context + ": " + message()`; OK stays OK.
  Status WithContext(std::string_view context) const;

  // Marks a status deliberately not inspected.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Status& status);

inline Status InvalidArgumentError(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}
inline Status NotFoundError(std::string message) {
  return Status(StatusCode::kNotFound, std::move(message));
}
inline Status OutOfRangeError(std::string message) {
  return Status(StatusCode::kOutOfRange, std::move(message));
}
inline Status FailedPreconditionError(std::string message) {
  return Status(StatusCode::kFailedPrecondition, std::move(message));
}
inline Status DataLossError(std::string message) {
  return Status(StatusCode::kDataLoss, std::move(message));
}
inline Status UnavailableError(std::string message) {
  return Status(StatusCode::kUnavailable, std::move(message));
}
inline Status DeadlineExceededError(std::string message) {
  return Status(StatusCode::kDeadlineExceeded, std::move(message));
}
inline Status CancelledError(std::string message) {
  return Status(StatusCode::kCancelled, std::move(message));
}
inline Status ResourceExhaustedError(std::string message) {
  return Status(StatusCode::kResourceExhausted, std::move(message));
}
inline Status InternalError(std::string message) {
  return Status(StatusCode::kInternal, std::move(message));
}

// Either a value of type T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : state_(std::move(status)) {  // NOLINT
    if (std::get<Status>(state_).ok()) {
      state_ = Status(StatusCode::kInternal, "Result built from an OK status");
    }
  }

  bool ok() const { return std::holds_alternative<T>(state_); }

  // OK when a value is held.
  Status status() const {
    return ok() ? Status::Ok() : std::get<Status>(state_);
  }

  // Precondition: ok().
  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> state_;
};

}  // namespace meridian

#define MERIDIAN_STATUS_CONCAT_INNER_(a, b) a##b
#define MERIDIAN_STATUS_CONCAT_(a, b) MERIDIAN_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (a Status); returns it from the enclosing function when
// it is not OK.
#define MERIDIAN_RETURN_IF_ERROR(expr)                           \
  do {                                                           \
    ::meridian::Status meridian_status_tmp_ = (expr);            \
    if (!meridian_status_tmp_.ok()) return meridian_status_tmp_; \
  } while (false)

// Evaluates `rexpr` (a Result<T>); on error returns its Status, otherwise
// moves the value into `lhs` (which may be a declaration: `auto x`).
#define MERIDIAN_ASSIGN_OR_RETURN(lhs, rexpr) \
  MERIDIAN_ASSIGN_OR_RETURN_IMPL_(            \
      MERIDIAN_STATUS_CONCAT_(meridian_result_tmp_, __LINE__), lhs, rexpr)

#define MERIDIAN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                    \
  if (!tmp.ok()) return tmp.status();                    \
  lhs = std::move(tmp).value()

#endif  // MERIDIAN_CORE_STATUS_H_
