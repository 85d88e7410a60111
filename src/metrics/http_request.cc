#include "metrics/http_request.h"

#include <cstdint>

namespace meridian {
namespace {

// RFC 9110 tchar.
bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
      (c >= '0' && c <= '9')) {
    return true;
  }
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*':
    case '+': case '-': case '.': case '^': case '_': case '`': case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// A field value's characters: tab, space, visible ASCII and obs-text.
bool IsFieldValueChar(char c) {
  const auto byte = static_cast<unsigned char>(c);
  return byte == '\t' || (byte >= 0x20 && byte != 0x7f);
}

char Lower(char c) { return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c; }

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

std::string_view TrimSpaces(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) {
    text.remove_prefix(1);
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) {
    text.remove_suffix(1);
  }
  return text;
}

// Offset just past the empty lines at the start of `bytes`; npos when a
// CR is the last byte (the line may yet turn out empty).
size_t SkipLeadingEmptyLines(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    if (bytes[i] == '\n') {
      ++i;
    } else if (bytes[i] == '\r') {
      if (i + 1 == bytes.size()) return std::string_view::npos;
      if (bytes[i + 1] != '\n') return i;  // a bare CR: the parser refuses
      i += 2;
    } else {
      return i;
    }
  }
  return i;
}

HttpRefusal Refuse(int status, std::string reason) {
  return HttpRefusal{status, std::move(reason)};
}

// Splits off the next line of `rest` (without its CRLF or LF). False at
// the end of the bytes or at a bare CR (*bare_cr set).
bool NextLine(std::string_view* rest, std::string_view* line, bool* bare_cr) {
  const size_t newline = rest->find('\n');
  if (newline == std::string_view::npos) return false;
  *line = rest->substr(0, newline);
  rest->remove_prefix(newline + 1);
  if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
  *bare_cr = line->find('\r') != std::string_view::npos;
  return !*bare_cr;
}

// What the header lines say that matters here.
struct HeaderFacts {
  bool close = false;          // Connection: close
  bool keep_alive = false;     // Connection: keep-alive
  bool has_length = false;
  uint64_t length = 0;         // Content-Length
  bool transfer_encoding = false;
};

// Reads one "name: value" line into `facts`; a refusal when malformed.
std::variant<std::monostate, HttpRefusal> ReadHeaderLine(std::string_view line,
                                                         HeaderFacts* facts) {
  if (line.front() == ' ' || line.front() == '\t') {
    return Refuse(400, "folded header line");
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) {
    return Refuse(400, "header line without a colon");
  }
  const std::string_view name = line.substr(0, colon);
  if (!IsToken(name)) return Refuse(400, "malformed header name");
  const std::string_view value = TrimSpaces(line.substr(colon + 1));
  for (char c : value) {
    if (!IsFieldValueChar(c)) {
      return Refuse(400, "control character in a header value");
    }
  }
  if (EqualsIgnoringCase(name, "connection")) {
    std::string_view options = value;
    while (!options.empty()) {
      const size_t comma = options.find(',');
      const std::string_view option = TrimSpaces(options.substr(0, comma));
      if (EqualsIgnoringCase(option, "close")) facts->close = true;
      if (EqualsIgnoringCase(option, "keep-alive")) facts->keep_alive = true;
      if (comma == std::string_view::npos) break;
      options.remove_prefix(comma + 1);
    }
  } else if (EqualsIgnoringCase(name, "content-length")) {
    if (value.empty() || value.size() > 18) {
      return Refuse(400, "malformed Content-Length");
    }
    uint64_t length = 0;
    for (char c : value) {
      if (c < '0' || c > '9') return Refuse(400, "malformed Content-Length");
      length = length * 10 + static_cast<uint64_t>(c - '0');
    }
    if (facts->has_length && facts->length != length) {
      return Refuse(400, "conflicting Content-Length");
    }
    facts->has_length = true;
    facts->length = length;
  } else if (EqualsIgnoringCase(name, "transfer-encoding")) {
    facts->transfer_encoding = true;
  }
  return std::monostate();
}

// "HTTP/1.0" -> 0, "HTTP/1.<digit>" -> 1; -1 for another major version,
// -2 when not a version at all.
int ParseVersion(std::string_view text) {
  if (text.size() != 8 || text.substr(0, 5) != "HTTP/" || text[6] != '.' ||
      text[5] < '0' || text[5] > '9' || text[7] < '0' || text[7] > '9') {
    return -2;
  }
  if (text[5] != '1') return -1;
  return text[7] == '0' ? 0 : 1;
}

}  // namespace

size_t FindHeadEnd(std::string_view bytes) {
  size_t i = SkipLeadingEmptyLines(bytes);
  if (i == std::string_view::npos) return i;
  while (true) {
    const size_t newline = bytes.find('\n', i);
    if (newline == std::string_view::npos) return std::string_view::npos;
    const size_t length = newline - i;
    if (length == 0 || (length == 1 && bytes[i] == '\r')) {
      return newline + 1;
    }
    i = newline + 1;
  }
}

ParsedRequestHead ParseRequestHead(std::string_view head) {
  const size_t start = SkipLeadingEmptyLines(head);
  if (start == std::string_view::npos) return Refuse(400, "incomplete head");
  std::string_view rest = head.substr(start);
  std::string_view line;
  bool bare_cr = false;
  if (!NextLine(&rest, &line, &bare_cr)) {
    return Refuse(400, bare_cr ? "bare CR in the head" : "incomplete head");
  }

  // The request line: METHOD SP target SP version, single spaces.
  const size_t first = line.find(' ');
  const size_t second = first == std::string_view::npos
                            ? first
                            : line.find(' ', first + 1);
  if (second == std::string_view::npos ||
      line.find(' ', second + 1) != std::string_view::npos) {
    return Refuse(400, "malformed request line");
  }
  const std::string_view method = line.substr(0, first);
  const std::string_view target = line.substr(first + 1, second - first - 1);
  const int minor_version = ParseVersion(line.substr(second + 1));
  if (!IsToken(method)) return Refuse(400, "malformed method");
  if (minor_version == -2) return Refuse(400, "malformed HTTP version");
  if (target.empty() || target.front() != '/') {
    return Refuse(400, "the target must be a path such as /metrics");
  }
  for (char c : target) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte <= 0x20 || byte >= 0x7f || c == '#') {
      return Refuse(400, "malformed target");
    }
  }
  if (minor_version == -1) {
    return Refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
  }

  HeaderFacts facts;
  while (true) {
    if (!NextLine(&rest, &line, &bare_cr)) {
      return Refuse(400, bare_cr ? "bare CR in the head" : "incomplete head");
    }
    if (line.empty()) break;
    auto read = ReadHeaderLine(line, &facts);
    if (auto* refusal = std::get_if<HttpRefusal>(&read)) {
      return std::move(*refusal);
    }
  }
  if (!rest.empty()) return Refuse(400, "bytes after the head");

  HttpRequestHead out;
  if (method == "GET") {
    out.method = HttpMethod::kGet;
  } else if (method == "HEAD") {
    out.method = HttpMethod::kHead;
  } else {
    return Refuse(405, "only GET and HEAD are served");
  }
  if (facts.transfer_encoding) {
    return Refuse(501, "a request body (Transfer-Encoding) is not accepted");
  }
  if (facts.has_length && facts.length != 0) {
    return Refuse(413, "a scrape carries no body");
  }
  out.path = std::string(target.substr(0, target.find('?')));
  out.minor_version = minor_version;
  out.keep_alive =
      !facts.close && (minor_version == 1 || facts.keep_alive);
  return out;
}

std::string_view HttpReasonPhrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}

}  // namespace meridian
