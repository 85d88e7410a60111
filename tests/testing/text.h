// Small text helpers of the tests: one ReadFile, one Contains. Header-only,
// so any test binary can include it without linking meridian_testing.
#ifndef MERIDIAN_TESTING_TEXT_H_
#define MERIDIAN_TESTING_TEXT_H_

#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

namespace meridian::testing {

// The whole file at `path`; empty when it cannot be read (a test then fails
// on what it expected to find).
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Whether `part` occurs in `text`.
inline bool Contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTING_TEXT_H_
