#include "meridian/core/z85.h"

#include <cstdint>

namespace meridian {
namespace {

constexpr std::string_view kZ85Alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&"
    "<>()[]{}@%$#";

}  // namespace

bool IsZ85Key(std::string_view key) {
  if (key.size() != kCurveKeyZ85Length) return false;
  for (size_t group = 0; group < key.size(); group += 5) {
    uint64_t value = 0;
    for (size_t i = group; i < group + 5; ++i) {
      const size_t digit = kZ85Alphabet.find(key[i]);
      if (digit == std::string_view::npos) return false;
      value = value * 85 + digit;
    }
    if (value > 0xFFFFFFFFull) return false;
  }
  return true;
}

}  // namespace meridian
