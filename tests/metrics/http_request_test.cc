// The metrics endpoint's request-head parser (src/metrics/http_request.h):
// what it accepts, and the status of each refusal.
#include "metrics/http_request.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>

namespace meridian {
namespace {

HttpRequestHead Accepted(const std::string& head) {
  const ParsedRequestHead parsed = ParseRequestHead(head);
  if (const auto* refusal = std::get_if<HttpRefusal>(&parsed)) {
    ADD_FAILURE() << "refused " << refusal->status << " (" << refusal->reason
                  << "): " << head;
    return {};
  }
  return std::get<HttpRequestHead>(parsed);
}

int RefusalStatus(const std::string& head) {
  const ParsedRequestHead parsed = ParseRequestHead(head);
  const auto* refusal = std::get_if<HttpRefusal>(&parsed);
  if (refusal == nullptr) return 0;
  EXPECT_FALSE(refusal->reason.empty());
  return refusal->status;
}

TEST(HttpRequestTest, FindsTheEndOfTheHead) {
  const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  EXPECT_EQ(FindHeadEnd(head), head.size());
  EXPECT_EQ(FindHeadEnd(head + "GET /next"), head.size());
  // Not there yet, byte by byte.
  for (size_t n = 0; n < head.size(); ++n) {
    EXPECT_EQ(FindHeadEnd(head.substr(0, n)), std::string::npos) << n;
  }
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.0\n\n"), 16u);    // bare LFs
  EXPECT_EQ(FindHeadEnd("\r\n\r\nGET / HTTP/1.0\r\n\r\n"), 22u);  // empty lines first
  EXPECT_EQ(FindHeadEnd("\r"), std::string::npos);
}

TEST(HttpRequestTest, AcceptsGetAndHead) {
  HttpRequestHead get = Accepted(
      "GET /metrics HTTP/1.1\r\nHost: localhost:9100\r\nUser-Agent: "
      "Prometheus/2.45\r\nAccept-Encoding: gzip\r\n\r\n");
  EXPECT_EQ(get.method, HttpMethod::kGet);
  EXPECT_EQ(get.path, "/metrics");
  EXPECT_EQ(get.minor_version, 1);
  EXPECT_TRUE(get.keep_alive);

  HttpRequestHead head = Accepted("HEAD /metrics?x=1&y HTTP/1.1\n\n");
  EXPECT_EQ(head.method, HttpMethod::kHead);
  EXPECT_EQ(head.path, "/metrics");  // without the query

  EXPECT_EQ(Accepted("\r\nGET /other HTTP/1.1\r\n\r\n").path, "/other");
  EXPECT_EQ(Accepted("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n").path, "/");
  // obs-text in a value is allowed; spaces around it are not part of it.
  Accepted("GET / HTTP/1.1\r\nX-Name: \xc3\xa9t\xc3\xa9  \r\n\r\n");
}

TEST(HttpRequestTest, KeepAliveFollowsTheVersionAndConnection) {
  EXPECT_TRUE(Accepted("GET / HTTP/1.1\r\n\r\n").keep_alive);
  EXPECT_FALSE(
      Accepted("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n").keep_alive);
  EXPECT_FALSE(Accepted("GET / HTTP/1.1\r\nconnection: te, close\r\n\r\n")
                   .keep_alive);
  EXPECT_FALSE(Accepted("GET / HTTP/1.0\r\n\r\n").keep_alive);
  HttpRequestHead old =
      Accepted("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  EXPECT_TRUE(old.keep_alive);
  EXPECT_EQ(old.minor_version, 0);
}

TEST(HttpRequestTest, RefusesWithTheRightStatus) {
  EXPECT_EQ(RefusalStatus("POST /metrics HTTP/1.1\r\n\r\n"), 405);
  EXPECT_EQ(RefusalStatus("DELETE / HTTP/1.1\r\n\r\n"), 405);
  EXPECT_EQ(RefusalStatus("GET / HTTP/2.0\r\n\r\n"), 505);
  EXPECT_EQ(RefusalStatus("GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\n"), 413);
  EXPECT_EQ(
      RefusalStatus("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
      501);
  for (const char* malformed : {
           "GET /metrics\r\n\r\n",                       // no version
           "GET  /metrics HTTP/1.1\r\n\r\n",             // two spaces
           "GET /metrics HTTP/1.1 x\r\n\r\n",            // four parts
           "GET metrics HTTP/1.1\r\n\r\n",               // not a path
           "GET * HTTP/1.1\r\n\r\n",
           "GET http://h/metrics HTTP/1.1\r\n\r\n",
           "GET /a\x01 HTTP/1.1\r\n\r\n",                // control in target
           "GET /a#frag HTTP/1.1\r\n\r\n",
           "GET / HTTQ/1.1\r\n\r\n",
           "GET / HTTP/1.1\r\nHost : x\r\n\r\n",         // space before ':'
           "GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
           "GET / HTTP/1.1\r\nNo colon\r\n\r\n",
           "GET / HTTP/1.1\r\n: empty name\r\n\r\n",
           "GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",          // bare CR
           "GET / HTTP/1.1\r\nX: a\x7f\r\n\r\n",         // DEL in a value
           "GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
           "GET / HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 1\r\n\r\n",
           "G(T / HTTP/1.1\r\n\r\n",                     // not a token
           "GET / HTTP/1.1\r\n\r\nextra",                // bytes after it
           "GET / HTTP/1.1\r\n",                         // incomplete
           "",
       }) {
    EXPECT_EQ(RefusalStatus(malformed), 400) << malformed;
  }
}

TEST(HttpRequestTest, ReasonPhrases) {
  EXPECT_EQ(HttpReasonPhrase(200), "OK");
  EXPECT_EQ(HttpReasonPhrase(431), "Request Header Fields Too Large");
  EXPECT_EQ(HttpReasonPhrase(999), "Error");
}

}  // namespace
}  // namespace meridian
