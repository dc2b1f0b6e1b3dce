// Status and Result<T>: how expected failures travel (bad config, bad files, bad data,
// corrupt checkpoints). Programming and device errors do not use Status; they abort
// through TRIDENT_CHECK (core/check.h).
//
// Every message names the culprit: the config key, the file, the rank. Callers add
// context with Status::with_context() rather than replacing the message.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace trident {

enum class StatusCode {
  kOk = 0,
  kInvalidConfig,   // a config key, a CLI flag, an impossible layout: exit 2
  kInvalidInput,    // a missing, truncated or malformed input file: exit 2
  kCorrupt,         // a checksum or structure mismatch in our own files: exit 1
  kIoError,         // the OS refused a read or write at run time: exit 1
  kInternal,        // anything else that should not happen: exit 1
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  static Status invalid_config(std::string m) { return {StatusCode::kInvalidConfig, std::move(m)}; }
  static Status invalid_input(std::string m) { return {StatusCode::kInvalidInput, std::move(m)}; }
  static Status corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
  static Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "context: message", keeping the code.
  Status with_context(const std::string& context) const {
    if (is_ok()) return *this;
    return {code_, context + ": " + message_};
  }

  // Process exit code (docs/ARCHITECTURE.md "Commands and exit codes"): 2 for bad usage,
  // config or input; 1 otherwise.
  int exit_code() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}           // NOLINT: implicit by design
  Result(Status status) : value_(std::move(status)) {}    // NOLINT: implicit by design

  bool is_ok() const { return std::holds_alternative<T>(value_); }
  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<Status>(value_);
  }
  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace trident

#define TRIDENT_CONCAT_INNER(a, b) a##b
#define TRIDENT_CONCAT(a, b) TRIDENT_CONCAT_INNER(a, b)

#define TRIDENT_RETURN_IF_ERROR(expr)              \
  do {                                             \
    ::trident::Status _trident_st = (expr);        \
    if (!_trident_st.is_ok()) return _trident_st;  \
  } while (0)

#define TRIDENT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.is_ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

// TRIDENT_ASSIGN_OR_RETURN(auto x, make_x()); returns the Status on failure.
#define TRIDENT_ASSIGN_OR_RETURN(lhs, expr) \
  TRIDENT_ASSIGN_OR_RETURN_IMPL(TRIDENT_CONCAT(_trident_res_, __LINE__), lhs, expr)
