// How the job file's validation reports what is wrong: issues recorded at
// dotted field paths ("site[1].workers[0].count"), and the ranges numeric
// fields are checked against. Used by the validators of each section
// (validate.h); single-threaded, like the validation that drives it.
#ifndef MERIDIAN_CONFIG_ISSUE_REPORTER_H_
#define MERIDIAN_CONFIG_ISSUE_REPORTER_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/generated_enum_reflection.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meridian/config/config.h"
#include "meridian/core/format.h"
#include "meridian/core/status.h"

namespace meridian::config_internal {

namespace gpb = google::protobuf;

// Fashion-MNIST has ten classes, labelled 0..9.
inline constexpr uint32_t kNumClasses = 10;

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();

// The allowed values of a real field: an interval, unbounded above when `hi`
// is +inf. NaN and +-Inf are never allowed.
struct RealRange {
  double lo;
  bool lo_open;
  double hi;
  bool hi_open;

  bool Contains(double value) const {
    if (!std::isfinite(value)) return false;
    if (lo_open ? value <= lo : value < lo) return false;
    if (hi_open ? value >= hi : value > hi) return false;
    return true;
  }
  // "> 0", ">= 0", "in [0, 1)".
  std::string Describe() const {
    if (std::isinf(hi)) return (lo_open ? "> " : ">= ") + FormatReal(lo);
    return std::string("in ") + (lo_open ? "(" : "[") + FormatReal(lo) + ", " +
           FormatReal(hi) + (hi_open ? ")" : "]");
  }
};

// The allowed values of an integer field: [lo, hi], unbounded above when
// `hi` is kUnbounded.
struct CountRange {
  uint64_t lo;
  uint64_t hi;

  bool Contains(uint64_t value) const { return value >= lo && value <= hi; }
  std::string Describe() const {
    if (hi == kUnbounded) return ">= " + std::to_string(lo);
    return "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  }
};

inline constexpr RealRange kPositive{0, true, kInf, true};      // > 0
inline constexpr RealRange kNonNegative{0, false, kInf, true};  // >= 0
inline constexpr RealRange kUnitInterval{0, false, 1, false};   // [0, 1]
inline constexpr RealRange kDecayFactor{0, true, 1, false};     // (0, 1]
inline constexpr RealRange kFraction{0, true, 1, false};        // (0, 1]
inline constexpr RealRange kOpenUnit{0, true, 1, true};         // (0, 1)
inline constexpr RealRange kHalfOpenUnit{0, false, 1, true};    // [0, 1)
inline constexpr RealRange kMomentum = kHalfOpenUnit;
inline constexpr RealRange kAboveOne{1, true, kInf, true};  // > 1

inline constexpr CountRange kAtLeastOne{1, kUnbounded};
inline constexpr CountRange kWorkersPerGroup{1, 1024};
inline constexpr CountRange kHiddenUnits{1, 65536};
inline constexpr CountRange kInputChannels{1, 4096};
inline constexpr CountRange kBatchSize{1, 65536};
inline constexpr CountRange kNumShards{1, 256};
inline constexpr CountRange kBlockSize{1, 1 << 20};
inline constexpr CountRange kClassLabel{0, kNumClasses - 1};
inline constexpr CountRange kClassesPerPart{1, kNumClasses};
inline constexpr CountRange kFactorRank{1, 1024};
inline constexpr CountRange kMatrixRows{1, 1 << 24};  // exact as floats
// A fit of l(t) = 1/(a^2 t + b) + c has 3 parameters.
inline constexpr CountRange kSamplesPerPeriod{3, 1000};
inline constexpr RealRange kImprovement{0, false, 1, true};  // [0, 1)

// "field[index]".
std::string Indexed(std::string_view field, int index);

// Records issues under a dotted field-path prefix ("site[1].workers[0]").
// Copies share the issue list; Nested() returns a reporter one level deeper.
class IssueReporter {
 public:
  explicit IssueReporter(std::vector<ConfigIssue>* issues,
                         std::string prefix = "")
      : issues_(issues), prefix_(std::move(prefix)) {}

  IssueReporter Nested(std::string_view field) const {
    return IssueReporter(issues_, Path(field));
  }
  IssueReporter Nested(std::string_view field, int index) const {
    return IssueReporter(issues_, Path(Indexed(field, index)));
  }

  void Report(std::string_view field, std::string message) const {
    ConfigIssue issue;
    issue.field = Path(field);
    issue.message = std::move(message);
    issues_->push_back(std::move(issue));
  }

  void Check(bool ok, std::string_view field, std::string message) const {
    if (!ok) Report(field, std::move(message));
  }

  void Real(std::string_view field, double value,
            const RealRange& range) const {
    if (range.Contains(value)) return;
    Report(field, std::string("must be ") +
                      (std::isfinite(value) ? "" : "finite and ") +
                      range.Describe() + ", got " + FormatReal(value));
  }

  void Count(std::string_view field, uint64_t value,
             const CountRange& range) const {
    Check(range.Contains(value), field,
          "must be " + range.Describe() + ", got " + std::to_string(value));
  }

  void NonEmpty(std::string_view field, const std::string& value) const {
    Check(!value.empty(), field, "must be non-empty");
  }

  // A ZeroMQ endpoint: tcp://, ipc:// or inproc:// (IsEndpoint).
  void Endpoint(std::string_view field, const std::string& value) const;
  // A metrics server's host:port (ParseMetricsAddress), or empty (none).
  void MetricsAddress(std::string_view field, const std::string& value) const;

  // The value must be a declared enumerator other than the UNSPECIFIED (0)
  // one.
  template <typename Enum>
  void Specified(std::string_view field, Enum value) const {
    const gpb::EnumDescriptor* type = gpb::GetEnumDescriptor<Enum>();
    const gpb::EnumValueDescriptor* named = type->FindValueByNumber(value);
    if (named != nullptr && named->number() != 0) return;
    std::string allowed;
    for (int i = 0; i < type->value_count(); ++i) {
      if (type->value(i)->number() == 0) continue;
      if (!allowed.empty()) allowed += ", ";
      allowed += type->value(i)->name();
    }
    Report(field,
           "must be one of " + allowed + ", got " +
               (named != nullptr ? named->name() : std::to_string(value)));
  }

 private:
  std::string Path(std::string_view field) const {
    if (prefix_.empty()) return std::string(field);
    return prefix_ + "." + std::string(field);
  }

  std::vector<ConfigIssue>* issues_;
  std::string prefix_;
};

// Whether `address` is a ZeroMQ endpoint (tcp://, ipc:// or inproc://).
bool IsEndpoint(std::string_view address);

// Reports an error of the form "field.path: message" at that field (under
// `root`), or the whole text at `root` when it has no such path.
void ReportAtPath(const Status& status, const IssueReporter& root);

}  // namespace meridian::config_internal

#endif  // MERIDIAN_CONFIG_ISSUE_REPORTER_H_
