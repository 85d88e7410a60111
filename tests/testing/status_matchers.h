// GoogleTest assertions and gMock matchers for Status and Result<T>, so a
// failing check prints the status it got:
//
//   ASSERT_OK(store.Apply(update));            // Status or Result<T>
//   EXPECT_OK(LoadJob(path)) << "job " << path;
//   EXPECT_THAT(Parse(bytes), StatusIs(StatusCode::kDataLoss));
//   EXPECT_THAT(Parse(bytes), StatusIs(StatusCode::kDataLoss,
//                                      HasSubstr("checksum")));
//   EXPECT_THAT(Sum(values), IsOkAndHolds(6));
//
// Header-only: any test binary can include it without linking
// meridian_testing.
#ifndef MERIDIAN_TESTING_STATUS_MATCHERS_H_
#define MERIDIAN_TESTING_STATUS_MATCHERS_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <type_traits>

#include "meridian/core/status.h"

namespace meridian {

// GoogleTest prints a value it has no printer for as bytes; these print the
// status (and a Result's status, or "OK (value)").
inline void PrintTo(const Status& status, std::ostream* os) {
  *os << status.ToString();
}
template <typename T>
void PrintTo(const Result<T>& result, std::ostream* os) {
  if (result.ok()) {
    *os << "OK (" << ::testing::PrintToString(*result) << ")";
  } else {
    *os << result.status().ToString();
  }
}

namespace testing {

inline const Status& StatusOf(const Status& status) { return status; }
template <typename T>
Status StatusOf(const Result<T>& result) {
  return result.status();
}

template <typename T>
inline constexpr bool kIsResult = false;
template <typename T>
inline constexpr bool kIsResult<Result<T>> = true;

// The predicate-formatter behind ASSERT_OK / EXPECT_OK: a Status, a
// Result<T>, or another library's status type with ok() and ToString()
// (Protobuf's util::Status).
template <typename T>
::testing::AssertionResult IsOkFormat(const char* expression,
                                      const T& value) {
  if (value.ok()) return ::testing::AssertionSuccess();
  std::string text;
  if constexpr (std::is_same_v<T, Status> || kIsResult<T>) {
    text = StatusOf(value).ToString();
  } else {
    text = value.ToString();
  }
  return ::testing::AssertionFailure() << expression << " is not OK: " << text;
}

// StatusIs(code[, message matcher]) on a Status or a Result<T>.
template <typename MessageMatcher>
class StatusIsMatcher {
 public:
  StatusIsMatcher(StatusCode code, MessageMatcher message)
      : code_(code), message_(std::move(message)) {}

  template <typename T>
  bool MatchAndExplain(const T& value,
                       ::testing::MatchResultListener* listener) const {
    const Status status = StatusOf(value);
    if (status.code() != code_) {
      *listener << "whose status is " << status.ToString();
      return false;
    }
    const ::testing::Matcher<const std::string&> message =
        ::testing::SafeMatcherCast<const std::string&>(message_);
    ::testing::StringMatchResultListener inner;
    if (!message.MatchAndExplain(status.message(), &inner)) {
      *listener << "whose message \"" << status.message()
                << "\" does not match";
      if (!inner.str().empty()) *listener << ", " << inner.str();
      return false;
    }
    return true;
  }
  void DescribeTo(std::ostream* os) const {
    *os << "has status " << StatusCodeName(code_) << " with a message that ";
    ::testing::SafeMatcherCast<const std::string&>(message_).DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "does not have status " << StatusCodeName(code_)
        << " with a message that ";
    ::testing::SafeMatcherCast<const std::string&>(message_).DescribeTo(os);
  }

 private:
  StatusCode code_;
  MessageMatcher message_;
};

template <typename MessageMatcher>
::testing::PolymorphicMatcher<StatusIsMatcher<MessageMatcher>> StatusIs(
    StatusCode code, MessageMatcher message) {
  return ::testing::MakePolymorphicMatcher(
      StatusIsMatcher<MessageMatcher>(code, std::move(message)));
}
inline auto StatusIs(StatusCode code) { return StatusIs(code, ::testing::_); }

// IsOk(): a Status or Result<T> that is OK.
inline auto IsOk() { return StatusIs(StatusCode::kOk); }

// IsOkAndHolds(m): a Result<T> holding a value that matches m.
MATCHER_P(IsOkAndHolds, value_matcher,
          negation ? "is not OK or holds a value that does not match"
                   : "is OK and holds a value that matches") {
  if (!arg.ok()) {
    *result_listener << "whose status is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

}  // namespace testing
}  // namespace meridian

// ASSERT_OK(expr) / EXPECT_OK(expr): expr (a Status or a Result<T>) is OK;
// on failure the message names the expression and prints its status. More
// context may be streamed: ASSERT_OK(x) << "while ...".
#define ASSERT_OK(expr) \
  ASSERT_PRED_FORMAT1(::meridian::testing::IsOkFormat, expr)
#define EXPECT_OK(expr) \
  EXPECT_PRED_FORMAT1(::meridian::testing::IsOkFormat, expr)

#endif  // MERIDIAN_TESTING_STATUS_MATCHERS_H_
