#include "durable/coding.h"

#include <zlib.h>

#include <cinttypes>
#include <cstdio>

namespace meridian::durable {

uint32_t Crc32(uint32_t crc, std::span<const std::byte> bytes) {
  if (bytes.empty()) return crc;
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

std::string Printable(std::string_view text) {
  constexpr size_t kMax = 256;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\x%02x", c);
      out += buffer;
    }
  }
  if (text.size() > kMax) out += "...";
  return out;
}

std::string Hex32(uint32_t value) {
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), "0x%08" PRIx32, value);
  return buffer;
}

}  // namespace meridian::durable
