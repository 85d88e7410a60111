// The head of an HTTP/1.x request as the metrics endpoint reads it from a
// peer: the one place where those bytes are parsed. A connection hands
// over the bytes up to and including the blank line that ends the head
// (FindHeadEnd); ParseRequestHead returns a typed HttpRequestHead or the
// refusal to answer (an HTTP status and why). Everything after the parse
// reads the typed value only.
//
// What is accepted (RFC 9112, strictly, for a server that only serves
// GET /metrics): a request line "METHOD SP origin-form SP HTTP/1.x", header
// lines "name: value" (a token, a colon right after it, a value without
// control characters other than tab), lines ending in CRLF or a bare LF,
// empty lines before the request line ignored. Refused: GET and HEAD are
// the only methods (405), HTTP versions other than 1.0 and 1.1 (505), a
// body (Content-Length other than 0: 413; any Transfer-Encoding: 501), and
// anything malformed (400): a bare CR, a space before a colon, a folded
// header line, a target that is not a path, a bad or repeated differing
// Content-Length. Pure functions, no allocation beyond the result.
#ifndef MERIDIAN_METRICS_HTTP_REQUEST_H_
#define MERIDIAN_METRICS_HTTP_REQUEST_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <variant>

namespace meridian {

enum class HttpMethod { kGet, kHead };

// A request the endpoint will answer (with 200 or 404).
struct HttpRequestHead {
  HttpMethod method = HttpMethod::kGet;
  // The target's path, without the query ("/metrics" of "/metrics?x=1").
  // Starts with '/', holds no control character, space or '#'.
  std::string path;
  int minor_version = 1;  // HTTP/1.<minor_version>: 0 or 1
  // The client allows another request on the connection: HTTP/1.1 unless
  // "Connection: close", HTTP/1.0 only with "Connection: keep-alive".
  bool keep_alive = true;

  friend bool operator==(const HttpRequestHead&,
                         const HttpRequestHead&) = default;
};

// Why a head is refused: the status to answer (the connection is closed
// after it) and a short reason for the response body.
struct HttpRefusal {
  int status = 400;
  std::string reason;
};

using ParsedRequestHead = std::variant<HttpRequestHead, HttpRefusal>;

// The size of the head at the start of `bytes` (request line, header lines
// and the blank line that ends them, with any empty lines before the
// request line), or std::string_view::npos while the blank line has not
// arrived.
size_t FindHeadEnd(std::string_view bytes);

// Parses a complete head (`FindHeadEnd(bytes)` bytes of it; trailing bytes
// after the blank line are refused as malformed).
ParsedRequestHead ParseRequestHead(std::string_view head);

// The reason phrase of the statuses the endpoint answers ("OK", "Not
// Found", ...; "Error" for any other).
std::string_view HttpReasonPhrase(int status);

}  // namespace meridian

#endif  // MERIDIAN_METRICS_HTTP_REQUEST_H_
