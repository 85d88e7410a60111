// CURVE keys, key files, the ZAP handler and secured sockets
// (include/meridian/security.h), with real ZeroMQ sockets on loopback.
#include "meridian/net/security.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "meridian/config/config.h"
#include "testing/processes.h"
#include "testing/stderr_capture.h"
#include "testing/test_data.h"
#include "testing/status_matchers.h"
#include "testing/text.h"

namespace meridian {
namespace {

using ::meridian::testing::Contains;

using std::chrono::milliseconds;
// How long a peer that should get through may take (a loaded machine), and
// how long one that must not get through is given to try.
constexpr milliseconds kDelivered(10000);
constexpr milliseconds kRefusedWindow(1500);

mode_t ModeOf(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
  return info.st_mode & 07777;
}

void WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  std::filesystem::remove(path);
  {
    std::ofstream out(path);
    out << text;
  }
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

CurveKeyPair NewPair() {
  Result<CurveKeyPair> pair = GenerateCurveKeyPair();
  EXPECT_OK(pair);
  return pair.ok() ? *pair : CurveKeyPair{};
}


TEST(SecurityTest, LibzmqHasCurve) { EXPECT_TRUE(CurveAvailable()); }

TEST(SecurityTest, Z85KeysAreRecognised) {
  const CurveKeyPair pair = NewPair();
  EXPECT_TRUE(IsZ85Key(pair.public_key));
  EXPECT_TRUE(IsZ85Key(pair.secret_key));
  EXPECT_NE(pair.public_key, pair.secret_key);
  EXPECT_FALSE(IsZ85Key(""));
  EXPECT_FALSE(IsZ85Key(pair.public_key.substr(1)));
  EXPECT_FALSE(IsZ85Key(pair.public_key + "a"));
  std::string bad = pair.public_key;
  bad[7] = '"';  // not in the alphabet
  EXPECT_FALSE(IsZ85Key(bad));
  // 5 characters encode at most 2^32 - 1: "#####" is 85^5 - 1.
  EXPECT_FALSE(IsZ85Key("#####" + pair.public_key.substr(5)));
}

TEST(SecurityTest, KeygenRoundTrip) {
  const std::string dir = testing::MakeTempDir("keys") + "/sub";
  const CurveKeyPair pair = NewPair();
  ASSERT_OK(WriteCurveKeyFiles(dir, "us", pair));
  EXPECT_EQ(ModeOf(dir + "/us.key"), 0600u);
  EXPECT_EQ(ModeOf(dir + "/us.pub"), 0644u);
  EXPECT_EQ(ModeOf(dir), 0700u);  // created by WriteCurveKeyFiles
  Result<std::string> secret = ReadSecretKeyFile(dir + "/us.key");
  ASSERT_OK(secret);
  EXPECT_EQ(*secret, pair.secret_key);
  Result<std::string> public_key = ReadPublicKeyFile(dir + "/us.pub");
  ASSERT_OK(public_key);
  EXPECT_EQ(*public_key, pair.public_key);
  Result<std::string> derived = CurvePublicKeyOf(*secret);
  ASSERT_OK(derived);
  EXPECT_EQ(*derived, pair.public_key);

  // Never overwritten: the error names the file, the old keys stay.
  const Status again = WriteCurveKeyFiles(dir, "us", NewPair());
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(again.message(), dir + "/us.key")) << again;
  EXPECT_EQ(*ReadSecretKeyFile(dir + "/us.key"), pair.secret_key);
  // Not even when only the public half is there.
  std::filesystem::remove(dir + "/us.key");
  const Status half = WriteCurveKeyFiles(dir, "us", NewPair());
  EXPECT_TRUE(Contains(half.message(), dir + "/us.pub")) << half;
  EXPECT_FALSE(std::filesystem::exists(dir + "/us.key"));
  // Site names are file names.
  EXPECT_FALSE(WriteCurveKeyFiles(dir, "../evil", NewPair()).ok());
}

TEST(SecurityTest, SecretKeyFileModeIsChecked) {
  const std::string dir = testing::MakeTempDir("keymode");
  const std::string path = dir + "/site.key";
  const CurveKeyPair pair = NewPair();
  const std::string text = "# a comment\n" + pair.secret_key + "\n";

  WriteFile(path, text, 0644);
  Result<std::string> world = ReadSecretKeyFile(path);
  ASSERT_FALSE(world.ok());
  EXPECT_EQ(world.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(world.status().message(), path)) << world.status();
  EXPECT_TRUE(Contains(world.status().message(), "0644")) << world.status();
  EXPECT_TRUE(Contains(world.status().message(), "chmod 600"));

  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  Result<std::string> group = ReadSecretKeyFile(path);
  ASSERT_FALSE(group.ok());
  EXPECT_TRUE(Contains(group.status().message(), "0640")) << group.status();

  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  Result<std::string> own = ReadSecretKeyFile(path);
  ASSERT_OK(own);
  EXPECT_EQ(*own, pair.secret_key);
  ASSERT_EQ(::chmod(path.c_str(), 0400), 0);
  EXPECT_OK(ReadSecretKeyFile(path));

  Result<std::string> missing = ReadSecretKeyFile(dir + "/nope.key");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.status().message(), dir + "/nope.key"));

  EXPECT_FALSE(ReadSecretKeyFile(dir).ok());  // a directory
}

TEST(SecurityTest, MalformedKeyFilesAreRefusedWithoutQuotingThem) {
  const std::string dir = testing::MakeTempDir("keybad");
  const std::string path = dir + "/site.key";
  const CurveKeyPair pair = NewPair();
  WriteFile(path, "# only a comment\n\n", 0600);
  EXPECT_FALSE(ReadSecretKeyFile(path).ok());
  WriteFile(path, pair.secret_key + "\n" + pair.secret_key + "\n", 0600);
  EXPECT_FALSE(ReadSecretKeyFile(path).ok());
  const std::string truncated = pair.secret_key.substr(0, 39);
  WriteFile(path, truncated + "\n", 0600);
  Result<std::string> bad = ReadSecretKeyFile(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(bad.status().message(), "line 1")) << bad.status();
  EXPECT_FALSE(Contains(bad.status().message(), truncated));
  // CRLF and surrounding blanks are tolerated.
  WriteFile(path, "  " + pair.secret_key + " \r\n", 0600);
  Result<std::string> crlf = ReadSecretKeyFile(path);
  ASSERT_OK(crlf);
  EXPECT_EQ(*crlf, pair.secret_key);
}

// Sets or clears an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(SecurityTest, SecretKeyPathPrefersFlagThenEnvironmentThenKeyDir) {
  pb::JobConfig job;
  ScopedEnv clear(kSecretKeyEnv, nullptr);
  Result<std::string> none = SecretKeyPath(job, "us", "");
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(Contains(none.status().message(), "--secret-key"));
  EXPECT_TRUE(Contains(none.status().message(), "key_dir"));
  job.mutable_security()->set_key_dir("/keys");
  EXPECT_EQ(*SecretKeyPath(job, "us", ""), "/keys/us.key");
  {
    ScopedEnv env(kSecretKeyEnv, "/env/us.key");
    EXPECT_EQ(*SecretKeyPath(job, "us", ""), "/env/us.key");
    EXPECT_EQ(*SecretKeyPath(job, "us", "/flag.key"), "/flag.key");
  }
}

pb::JobConfig TwoSiteJob(const std::string& key_dir, const CurveKeyPair& a,
                         const CurveKeyPair& b) {
  pb::JobConfig job;
  pb::SiteConfig* site_a = job.add_site();
  site_a->set_name("a");
  site_a->add_workers()->set_count(1);
  site_a->set_curve_public_key(a.public_key);
  pb::SiteConfig* site_b = job.add_site();
  site_b->set_name("b");
  site_b->add_workers()->set_count(1);
  site_b->set_curve_public_key(b.public_key);
  job.mutable_security()->set_key_dir(key_dir);
  return job;
}

TEST(SecurityTest, SiteKeysMustMatchTheJobFile) {
  ScopedEnv clear(kSecretKeyEnv, nullptr);
  const std::string dir = testing::MakeTempDir("sitekeys");
  const CurveKeyPair a = NewPair();
  const CurveKeyPair b = NewPair();
  ASSERT_OK(WriteCurveKeyFiles(dir, "a", a));
  pb::JobConfig job = TwoSiteJob(dir, a, b);
  Result<SiteCurveKeys> keys = LoadSiteCurveKeys(job, 0, {1}, "");
  ASSERT_OK(keys);
  EXPECT_EQ(keys->own.public_key, a.public_key);
  EXPECT_EQ(keys->own.secret_key, a.secret_key);
  EXPECT_EQ(keys->peers.at("b"), b.public_key);

  // Site b has no key file in the directory.
  Result<SiteCurveKeys> no_file = LoadSiteCurveKeys(job, 1, {0}, "");
  ASSERT_FALSE(no_file.ok());
  EXPECT_TRUE(Contains(no_file.status().message(), dir + "/b.key"))
      << no_file.status();
  // a's key file given to site b: the key does not belong to b.
  Result<SiteCurveKeys> wrong = LoadSiteCurveKeys(job, 1, {0}, dir + "/a.key");
  ASSERT_FALSE(wrong.ok());
  EXPECT_TRUE(Contains(wrong.status().message(), b.public_key))
      << wrong.status();
  EXPECT_FALSE(Contains(wrong.status().message(), a.secret_key));
  // A peer without a listed key.
  job.mutable_site(1)->clear_curve_public_key();
  Result<SiteCurveKeys> no_peer_key = LoadSiteCurveKeys(job, 0, {1}, "");
  ASSERT_FALSE(no_peer_key.ok());
  EXPECT_TRUE(Contains(no_peer_key.status().message(), "site 'b'"))
      << no_peer_key.status();
  EXPECT_TRUE(Contains(no_peer_key.status().message(), "meridian keygen"));
}

// ---- the job file -----------------------------------------------------------

std::vector<std::string> IssueFields(const pb::JobConfig& job) {
  std::vector<std::string> fields;
  for (const ConfigIssue& issue : ValidateJobConfig(job)) {
    fields.push_back(issue.field + ": " + issue.message);
  }
  return fields;
}

TEST(SecurityTest, JobFileKeysAreValidated) {
  const CurveKeyPair a = NewPair();
  const CurveKeyPair b = NewPair();
  pb::JobConfig job = TwoSiteJob("/keys", a, b);
  EXPECT_TRUE(IssueFields(job).empty())
      << ::testing::PrintToString(IssueFields(job));
  // No keys at all is fine for validation (`meridian run` makes some).
  job.mutable_site(0)->clear_curve_public_key();
  job.mutable_site(1)->clear_curve_public_key();
  EXPECT_TRUE(IssueFields(job).empty());
  // Some but not all: the missing one is named.
  job.mutable_site(0)->set_curve_public_key(a.public_key);
  std::vector<std::string> issues = IssueFields(job);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_TRUE(Contains(issues[0], "site[1].curve_public_key")) << issues[0];
  // ... unless CURVE is off.
  job.mutable_security()->set_curve(false);
  EXPECT_TRUE(IssueFields(job).empty());
  job.mutable_security()->set_curve(true);
  // Malformed and duplicated keys.
  job.mutable_site(1)->set_curve_public_key("too short");
  issues = IssueFields(job);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_TRUE(Contains(issues[0], "site[1].curve_public_key")) << issues[0];
  EXPECT_TRUE(Contains(issues[0], "Z85")) << issues[0];
  job.mutable_site(1)->set_curve_public_key(a.public_key);
  issues = IssueFields(job);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_TRUE(Contains(issues[0], "site 'a'")) << issues[0];
}

TEST(SecurityTest, JobFileKeysHaveLineAndColumn) {
  const std::string text =
      "site { name: \"a\" workers { count: 1 } curve_public_key: \"abc\" }\n"
      "site { name: \"b\" workers { count: 1 }\n"
      "       curve_public_key: \"" +
      NewPair().public_key + "\" }\n";
  std::vector<ConfigIssue> issues;
  Result<pb::JobConfig> job = ParseJobConfig(text, "job.pbtxt", &issues);
  ASSERT_FALSE(job.ok());
  ASSERT_EQ(issues.size(), 1u) << job.status();
  EXPECT_EQ(issues[0].line, 1);
  EXPECT_GT(issues[0].column, 1);
}

// ---- sockets ----------------------------------------------------------------

// A CURVE server (ROUTER) in its own context with a ZAP handler admitting
// `allowed`, bound to a free loopback port.
struct SecureServer {
  explicit SecureServer(const std::map<std::string, std::string>& allowed,
                        bool with_handler = true)
      : server_keys(NewPair()), socket(context, zmq::socket_type::router) {
    if (with_handler) {
      Result<std::unique_ptr<ZapHandler>> started =
          ZapHandler::Start(context, allowed, "test server");
      EXPECT_OK(started);
      if (started.ok()) zap = std::move(*started);
    }
    socket.set(zmq::sockopt::linger, 0);
    EXPECT_OK(MakeCurveServer(socket, server_keys));
    socket.bind("tcp://127.0.0.1:*");
    endpoint = socket.get(zmq::sockopt::last_endpoint);
  }

  // One [routing id, body] message, or nullopt after `timeout`.
  std::optional<std::pair<zmq::message_t, zmq::message_t>> Receive(
      milliseconds timeout) {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, timeout);
    if (!(item.revents & ZMQ_POLLIN)) return std::nullopt;
    zmq::message_t id;
    zmq::message_t body;
    EXPECT_TRUE(socket.recv(id));
    EXPECT_TRUE(socket.recv(body));
    return std::make_pair(std::move(id), std::move(body));
  }

  zmq::context_t context;
  CurveKeyPair server_keys;
  std::unique_ptr<ZapHandler> zap;  // outlives `socket`
  zmq::socket_t socket;
  std::string endpoint;
};

std::unique_ptr<zmq::socket_t> Client(zmq::context_t& context,
                                      const std::string& endpoint,
                                      const CurveKeyPair* own,
                                      const std::string& server_key) {
  auto socket =
      std::make_unique<zmq::socket_t>(context, zmq::socket_type::dealer);
  socket->set(zmq::sockopt::linger, 0);
  if (own != nullptr) {
    EXPECT_OK(MakeCurveClient(*socket, *own, server_key));
  }
  socket->connect(endpoint);
  return socket;
}

bool ReceivesWithin(zmq::socket_t& socket, milliseconds timeout) {
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, timeout);
  return (item.revents & ZMQ_POLLIN) != 0;
}

TEST(SecurityTest, ListedKeyIsAdmittedAndNamed) {
  const CurveKeyPair client_keys = NewPair();
  SecureServer server({{client_keys.public_key, "site-b"}});
  zmq::context_t context;
  auto client = Client(context, server.endpoint, &client_keys,
                       server.server_keys.public_key);
  client->send(zmq::str_buffer("ping"));
  auto got = server.Receive(kDelivered);
  ASSERT_TRUE(got) << "the listed client's message did not arrive";
  EXPECT_EQ(got->second.to_string(), "ping");
  // The ZAP user id (the key's name) travels with every message.
  EXPECT_STREQ(got->second.gets("User-Id"), "site-b");
  server.socket.send(got->first, zmq::send_flags::sndmore);
  server.socket.send(zmq::str_buffer("pong"));
  ASSERT_TRUE(ReceivesWithin(*client, kDelivered));
  zmq::message_t reply;
  ASSERT_TRUE(client->recv(reply));
  EXPECT_EQ(reply.to_string(), "pong");
  EXPECT_EQ(server.zap->admitted(), 1u);
  EXPECT_EQ(server.zap->refused(), 0u);
}

TEST(SecurityTest, UnknownKeyIsRefusedAndLogged) {
  const CurveKeyPair listed = NewPair();
  const CurveKeyPair stranger = NewPair();
  SecureServer server({{listed.public_key, "site-b"}});
  zmq::context_t context;
  ::testing::internal::CaptureStderr();
  auto client = Client(context, server.endpoint, &stranger,
                       server.server_keys.public_key);
  client->send(zmq::str_buffer("let me in"));
  EXPECT_FALSE(server.Receive(kRefusedWindow));
  testing::WaitUntil([&] { return server.zap->refused() > 0; });
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_GE(server.zap->refused(), 1u);
  EXPECT_EQ(server.zap->admitted(), 0u);
  EXPECT_FALSE(ReceivesWithin(*client, milliseconds(100)));
  // The refusal names the peer's address and key.
  EXPECT_TRUE(Contains(log, "refused a CURVE connection from 127.0.0.1"))
      << log;
  EXPECT_TRUE(Contains(log, stranger.public_key)) << log;
}

TEST(SecurityTest, PlaintextPeerCannotTalkToACurveEndpoint) {
  const CurveKeyPair listed = NewPair();
  SecureServer server({{listed.public_key, "site-b"}});
  zmq::context_t context;
  auto plain = Client(context, server.endpoint, nullptr, "");
  plain->send(zmq::str_buffer("hello in the clear"));
  EXPECT_FALSE(server.Receive(kRefusedWindow));
  EXPECT_EQ(server.zap->admitted(), 0u);

  // Nor a CURVE client a plaintext server.
  zmq::context_t plain_context;
  zmq::socket_t plain_server(plain_context, zmq::socket_type::router);
  plain_server.set(zmq::sockopt::linger, 0);
  plain_server.bind("tcp://127.0.0.1:*");
  auto secure = Client(context, plain_server.get(zmq::sockopt::last_endpoint),
                       &listed, server.server_keys.public_key);
  secure->send(zmq::str_buffer("secret"));
  EXPECT_FALSE(ReceivesWithin(plain_server, kRefusedWindow));
}

TEST(SecurityTest, ClientRefusesAServerWithAnotherKey) {
  const CurveKeyPair client_keys = NewPair();
  SecureServer server({{client_keys.public_key, "site-b"}});
  zmq::context_t context;
  // The client expects another server (an impostor holds this endpoint).
  auto client =
      Client(context, server.endpoint, &client_keys, NewPair().public_key);
  client->send(zmq::str_buffer("for the real server only"));
  EXPECT_FALSE(server.Receive(kRefusedWindow));
}

TEST(SecurityTest, CurveServerWithoutZapHandlerAdmitsNobody) {
  // Fail closed: libzmq would otherwise admit every key.
  SecureServer server({}, /*with_handler=*/false);
  zmq::context_t context;
  const CurveKeyPair anyone = NewPair();
  auto client =
      Client(context, server.endpoint, &anyone, server.server_keys.public_key);
  client->send(zmq::str_buffer("anyone?"));
  EXPECT_FALSE(server.Receive(kRefusedWindow));
}

TEST(SecurityTest, OneZapHandlerPerContext) {
  zmq::context_t context;
  Result<std::unique_ptr<ZapHandler>> first =
      ZapHandler::Start(context, {}, "first");
  ASSERT_OK(first);
  Result<std::unique_ptr<ZapHandler>> second =
      ZapHandler::Start(context, {}, "second");
  EXPECT_FALSE(second.ok());
  EXPECT_FALSE(ZapHandler::Start(context, {{"not a key", "x"}}, "bad").ok());
}

// ---- meridian keygen --------------------------------------------------------

TEST(SecurityTest, KeygenCommandWritesAPairAndPrintsTheJobLine) {
  const std::string dir = testing::MakeTempDir("keygen-cli") + "/keys";
  const std::string command =
      std::string(MERIDIAN_BINARY) + " keygen --site eu --out " + dir + " 2>&1";
  const testing::CommandResult first = testing::RunCommand(command);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  Result<std::string> public_key = ReadPublicKeyFile(dir + "/eu.pub");
  ASSERT_OK(public_key);
  EXPECT_TRUE(
      Contains(first.output, "curve_public_key: \"" + *public_key + "\""))
      << first.output;
  EXPECT_EQ(ModeOf(dir + "/eu.key"), 0600u);
  Result<std::string> secret = ReadSecretKeyFile(dir + "/eu.key");
  ASSERT_OK(secret);
  EXPECT_FALSE(Contains(first.output, *secret));
  EXPECT_EQ(*CurvePublicKeyOf(*secret), *public_key);
  // A second run refuses to overwrite the pair.
  const testing::CommandResult second = testing::RunCommand(command);
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_TRUE(Contains(second.output, "already exists")) << second.output;
  EXPECT_EQ(*ReadSecretKeyFile(dir + "/eu.key"), *secret);
}

}  // namespace
}  // namespace meridian
