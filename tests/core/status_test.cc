#include "meridian/core/status.h"
#include "testing/status_matchers.h"

#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace meridian {
namespace {

TEST(StatusTest, DefaultIsOk) {
  const Status status;
  EXPECT_OK(status);
  EXPECT_EQ(status.code(), StatusCode::kOk);
  EXPECT_EQ(status.message(), "");
  EXPECT_EQ(status.ToString(), "OK");
  EXPECT_EQ(Status::Ok(), status);
}

TEST(StatusTest, HelpersSetCodeAndMessage) {
  struct Case {
    Status status;
    StatusCode code;
    std::string name;
  };
  const std::vector<Case> cases = {
      {InvalidArgumentError("m"), StatusCode::kInvalidArgument,
       "INVALID_ARGUMENT"},
      {NotFoundError("m"), StatusCode::kNotFound, "NOT_FOUND"},
      {OutOfRangeError("m"), StatusCode::kOutOfRange, "OUT_OF_RANGE"},
      {FailedPreconditionError("m"), StatusCode::kFailedPrecondition,
       "FAILED_PRECONDITION"},
      {DataLossError("m"), StatusCode::kDataLoss, "DATA_LOSS"},
      {UnavailableError("m"), StatusCode::kUnavailable, "UNAVAILABLE"},
      {DeadlineExceededError("m"), StatusCode::kDeadlineExceeded,
       "DEADLINE_EXCEEDED"},
      {CancelledError("m"), StatusCode::kCancelled, "CANCELLED"},
      {InternalError("m"), StatusCode::kInternal, "INTERNAL"},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(c.status.ok()) << c.name;
    EXPECT_EQ(c.status.code(), c.code) << c.name;
    EXPECT_EQ(c.status.message(), "m") << c.name;
    EXPECT_EQ(StatusCodeName(c.code), c.name);
    EXPECT_EQ(c.status.ToString(), c.name + ": m");
  }
  EXPECT_EQ(StatusCodeName(StatusCode::kOk), "OK");
  EXPECT_EQ(StatusCodeName(static_cast<StatusCode>(999)), "UNKNOWN");
}

TEST(StatusTest, EqualityComparesCodeAndMessage) {
  EXPECT_EQ(NotFoundError("x"), NotFoundError("x"));
  EXPECT_FALSE(NotFoundError("x") == NotFoundError("y"));
  EXPECT_FALSE(NotFoundError("x") == InternalError("x"));
  EXPECT_FALSE(Status() == InternalError(""));
}

TEST(StatusTest, StreamsAsToString) {
  std::ostringstream out;
  out << DataLossError("truncated") << " | " << Status();
  EXPECT_EQ(out.str(), "DATA_LOSS: truncated | OK");
}

TEST(StatusTest, WithContextPrependsAndKeepsCode) {
  const Status status = NotFoundError("no file").WithContext("loading job");
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "loading job: no file");
  EXPECT_EQ(status.WithContext("outer").message(),
            "outer: loading job: no file");
  const Status ok = Status::Ok().WithContext("ignored");
  EXPECT_OK(ok);
  EXPECT_EQ(ok.message(), "");
}

TEST(ResultTest, HoldsAValue) {
  Result<std::string> result(std::string("hello"));
  ASSERT_OK(result);
  EXPECT_OK(result.status());
  EXPECT_EQ(result.value(), "hello");
  EXPECT_EQ(*result, "hello");
  EXPECT_EQ(result->size(), 5u);
  result.value() += "!";
  EXPECT_EQ(*result, "hello!");
  const Result<std::string>& view = result;
  EXPECT_EQ(view->size(), 6u);
}

TEST(ResultTest, HoldsAnError) {
  const Result<int> result = OutOfRangeError("index 7");
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.status(), OutOfRangeError("index 7"));
}

TEST(ResultTest, OkStatusBecomesInternal) {
  const Result<int> result = Status::Ok();
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInternal);
  EXPECT_FALSE(result.status().message().empty());
}

TEST(ResultTest, MoveOnlyValue) {
  Result<std::unique_ptr<int>> result = std::make_unique<int>(7);
  ASSERT_OK(result);
  std::unique_ptr<int> owned = std::move(result).value();
  ASSERT_NE(owned, nullptr);
  EXPECT_EQ(*owned, 7);
}

// --- Macros ----------------------------------------------------------------

Status Fail(int* calls, Status status) {
  ++*calls;
  return status;
}

Status TwoSteps(int* calls, Status first, std::vector<int>* reached) {
  MERIDIAN_RETURN_IF_ERROR(Fail(calls, std::move(first)));
  reached->push_back(1);
  MERIDIAN_RETURN_IF_ERROR(Fail(calls, Status::Ok()));
  reached->push_back(2);
  return Status::Ok();
}

TEST(MacroTest, ReturnIfErrorReturnsTheFirstError) {
  int calls = 0;
  std::vector<int> reached;
  EXPECT_EQ(TwoSteps(&calls, DataLossError("bad"), &reached),
            DataLossError("bad"));
  EXPECT_EQ(calls, 1);  // evaluated once, then returned
  EXPECT_TRUE(reached.empty());

  calls = 0;
  EXPECT_OK(TwoSteps(&calls, Status::Ok(), &reached));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(reached, (std::vector<int>{1, 2}));
}

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError(std::to_string(x) + " is odd");
  return x / 2;
}

// Two uses in one function (distinct temporaries), one declaring and one
// assigning to an existing variable.
Result<int> Quarter(int x, int* after_first) {
  MERIDIAN_ASSIGN_OR_RETURN(const int half, Half(x));
  *after_first = half;
  int quarter = -1;
  MERIDIAN_ASSIGN_OR_RETURN(quarter, Half(half));
  return quarter;
}

TEST(MacroTest, AssignOrReturn) {
  int after_first = 0;
  Result<int> ok = Quarter(12, &after_first);
  ASSERT_OK(ok);
  EXPECT_EQ(*ok, 3);
  EXPECT_EQ(after_first, 6);

  after_first = 0;
  Result<int> first_fails = Quarter(7, &after_first);
  EXPECT_EQ(first_fails.status(), InvalidArgumentError("7 is odd"));
  EXPECT_EQ(after_first, 0);

  Result<int> second_fails = Quarter(6, &after_first);
  EXPECT_EQ(second_fails.status(), InvalidArgumentError("3 is odd"));
  EXPECT_EQ(after_first, 3);
}

Result<std::unique_ptr<int>> MakeBox(int v) {
  if (v < 0) return InvalidArgumentError("negative");
  return std::make_unique<int>(v);
}

Status UnboxInto(int v, int* out) {
  MERIDIAN_ASSIGN_OR_RETURN(std::unique_ptr<int> box, MakeBox(v));
  *out = *box;
  return Status::Ok();
}

TEST(MacroTest, AssignOrReturnMovesMoveOnlyValues) {
  int out = 0;
  EXPECT_OK(UnboxInto(5, &out));
  EXPECT_EQ(out, 5);
  EXPECT_EQ(UnboxInto(-1, &out), InvalidArgumentError("negative"));
  EXPECT_EQ(out, 5);
}

}  // namespace
}  // namespace meridian
