#include "meridian/net/security.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "meridian/core/log.h"
#include "meridian/core/socket_close.h"

namespace meridian {
namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
constexpr auto kZapPoll = std::chrono::milliseconds(100);
// A key file is a comment and a 40-character line; anything this large is
// not one.
constexpr off_t kMaxKeyFileBytes = 64 * 1024;
constexpr size_t kCurveKeyBytes = 32;

// ZMQ_ZAP_ENFORCE_DOMAIN is declared only in zmq.h's draft section, but
// libzmq 4.3 implements it in every build. With it AND a ZAP domain, a CURVE
// server refuses a client when no ZAP handler is bound instead of admitting
// every key (measured on 4.3.4; with it but without a domain, libzmq skips
// ZAP altogether — so the two always go together).
constexpr const char* kZapDomain = "meridian";
#ifdef ZMQ_ZAP_ENFORCE_DOMAIN
constexpr int kZapEnforceDomain = ZMQ_ZAP_ENFORCE_DOMAIN;
#else
constexpr int kZapEnforceDomain = 93;
#endif

std::string ErrnoText(int error) {
  return std::generic_category().message(error);
}

std::string ModeText(mode_t mode) {
  char buffer[8];
  std::snprintf(buffer, sizeof(buffer), "%04o",
                static_cast<unsigned>(mode & 07777));
  return buffer;
}

// The one key line of a key file's text; errors never quote the text (it
// may be a secret).
Result<std::string> ParseKeyFile(const std::string& text,
                                 const std::string& what,
                                 const std::string& path) {
  std::string key;
  int keys = 0;
  int line_number = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    ++line_number;
    while (!line.empty() &&
           (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
      line.remove_suffix(1);
    }
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) {
      line.remove_prefix(1);
    }
    if (line.empty() || line.front() == '#') continue;
    ++keys;
    if (!IsZ85Key(line)) {
      return InvalidArgumentError(
          what + " '" + path + "': line " + std::to_string(line_number) +
          " is not a CURVE key (expected 40 characters of the Z85 alphabet, "
          "as `meridian keygen` writes)");
    }
    key = std::string(line);
  }
  if (keys != 1) {
    return InvalidArgumentError(
        what + " '" + path + "' holds " + std::to_string(keys) +
        " key lines; expected exactly one (plus '#' comment lines)");
  }
  return key;
}

// Reads a whole small file from an open descriptor.
Result<std::string> ReadAll(int fd, const std::string& what,
                            const std::string& path) {
  std::string text;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return InvalidArgumentError("cannot read " + what + " '" + path +
                                  "': " + ErrnoText(errno));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (text.size() > static_cast<size_t>(kMaxKeyFileBytes)) {
      return InvalidArgumentError(what + " '" + path +
                                  "' is too large to be a key file");
    }
  }
  return text;
}

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  // Closes now; returns the errno of a failed close (0 on success).
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

// `what` names the file in errors ("secret key file", ...).
Result<std::string> ReadKeyFile(const std::string& path, bool secret,
                                const std::string& what) {
  // O_NONBLOCK: a FIFO given by mistake must not block the open.
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    const int error = errno;
    if (error == ENOENT) {
      return NotFoundError(what + " '" + path + "' does not exist");
    }
    return InvalidArgumentError("cannot open " + what + " '" + path +
                                "': " + ErrnoText(error));
  }
  // fstat on the open file: the mode checked is the mode of what is read.
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) {
    return InvalidArgumentError("cannot stat " + what + " '" + path +
                                "': " + ErrnoText(errno));
  }
  if (!S_ISREG(info.st_mode)) {
    return InvalidArgumentError(what + " '" + path + "' is not a regular file");
  }
  if (secret && (info.st_mode & 077) != 0) {
    return FailedPreconditionError(
        what + " '" + path + "' has mode " + ModeText(info.st_mode) +
        ": a secret key must not be accessible to group or others (fix: "
        "chmod 600 '" +
        path + "')");
  }
  if (info.st_size > kMaxKeyFileBytes) {
    return InvalidArgumentError(what + " '" + path +
                                "' is too large to be a key file");
  }
  MERIDIAN_ASSIGN_OR_RETURN(std::string text, ReadAll(fd.get(), what, path));
  return ParseKeyFile(text, what, path);
}

// Creates `path` exclusively with `mode` (exactly, whatever the umask) and
// writes `text`.
Status WriteNewFile(const std::string& path, mode_t mode,
                    const std::string& text) {
  FileDescriptor fd(
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  if (fd.get() < 0) {
    const int error = errno;
    if (error == EEXIST) {
      return FailedPreconditionError(
          "key file '" + path +
          "' already exists; keys are never overwritten (move it away "
          "first if you really mean to replace it)");
    }
    return InvalidArgumentError("cannot create key file '" + path +
                                "': " + ErrnoText(error));
  }
  if (::fchmod(fd.get(), mode) != 0) {
    return InvalidArgumentError("cannot set the mode of key file '" + path +
                                "': " + ErrnoText(errno));
  }
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n =
        ::write(fd.get(), text.data() + written, text.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return InvalidArgumentError("cannot write key file '" + path +
                                  "': " + ErrnoText(errno));
    }
    written += static_cast<size_t>(n);
  }
  if (const int error = fd.Close(); error != 0) {
    return InvalidArgumentError("cannot write key file '" + path +
                                "': " + ErrnoText(error));
  }
  return Status::Ok();
}

std::string Z85Of(const zmq::message_t& frame) {
  if (frame.size() != kCurveKeyBytes) return "(malformed key)";
  std::array<char, kCurveKeyZ85Length + 1> text{};
  if (zmq_z85_encode(text.data(), static_cast<const uint8_t*>(frame.data()),
                     kCurveKeyBytes) == nullptr) {
    return "(malformed key)";
  }
  return text.data();
}

}  // namespace

bool CurveAvailable() { return zmq_has("curve") != 0; }

Result<CurveKeyPair> GenerateCurveKeyPair() {
  std::array<char, kCurveKeyZ85Length + 1> public_key{};
  std::array<char, kCurveKeyZ85Length + 1> secret_key{};
  if (zmq_curve_keypair(public_key.data(), secret_key.data()) != 0) {
    return UnavailableError(
        "cannot generate a CURVE key pair: " + ErrnoText(zmq_errno()) +
        " (this libzmq was built without CURVE/libsodium)");
  }
  CurveKeyPair pair{public_key.data(), secret_key.data()};
  std::memset(secret_key.data(), 0, secret_key.size());
  return pair;
}

Result<std::string> CurvePublicKeyOf(std::string_view secret_key) {
  if (!IsZ85Key(secret_key)) {
    return InvalidArgumentError("not a Z85 CURVE key");
  }
  const std::string secret(secret_key);
  std::array<char, kCurveKeyZ85Length + 1> public_key{};
  if (zmq_curve_public(public_key.data(), secret.c_str()) != 0) {
    return UnavailableError("cannot derive the CURVE public key: " +
                            ErrnoText(zmq_errno()));
  }
  return std::string(public_key.data());
}

Status WriteCurveKeyFiles(const std::string& dir, const std::string& name,
                          const CurveKeyPair& pair) {
  if (!IsZ85Key(pair.public_key) || !IsZ85Key(pair.secret_key)) {
    return InvalidArgumentError("not a Z85 CURVE key pair");
  }
  // Site names are file names (as the job file requires).
  const bool safe_name =
      !name.empty() && name != "." && name != ".." &&
      std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
      });
  if (!safe_name) {
    return InvalidArgumentError(
        "site name '" + name +
        "' must contain only letters, digits, '_', '.' and '-' (as in the "
        "job file)");
  }
  std::error_code error;
  if (!std::filesystem::exists(dir, error)) {
    std::filesystem::create_directories(dir, error);
    if (error) {
      return InvalidArgumentError("cannot create key directory '" + dir +
                                  "': " + error.message());
    }
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all, error);
  } else if (!std::filesystem::is_directory(dir, error)) {
    return InvalidArgumentError("'" + dir + "' is not a directory");
  }
  const std::string secret_path = dir + "/" + name + ".key";
  const std::string public_path = dir + "/" + name + ".pub";
  // Neither file may exist: a half-replaced pair is worse than none.
  for (const std::string& path : {secret_path, public_path}) {
    if (std::filesystem::symlink_status(path, error).type() !=
        std::filesystem::file_type::not_found) {
      return FailedPreconditionError(
          "key file '" + path +
          "' already exists; keys are never overwritten (move it away "
          "first if you really mean to replace it)");
    }
  }
  MERIDIAN_RETURN_IF_ERROR(WriteNewFile(
      secret_path, 0600,
      "# Meridian CURVE secret key of site '" + name +
          "' (Z85). Keep it private (mode 0600); never put it in a job "
          "file.\n" +
          pair.secret_key + "\n"));
  Status written =
      WriteNewFile(public_path, 0644,
                   "# Meridian CURVE public key of site '" + name +
                       "' (Z85). In the job file: site { name: \"" + name +
                       "\" curve_public_key: \"" + pair.public_key + "\" }\n" +
                       pair.public_key + "\n");
  if (!written.ok()) std::filesystem::remove(secret_path, error);
  return written;
}

Result<std::string> ReadSecretKeyFile(const std::string& path) {
  return ReadKeyFile(path, /*secret=*/true, "secret key file");
}

Result<std::string> ReadPublicKeyFile(const std::string& path) {
  return ReadKeyFile(path, /*secret=*/false, "public key file");
}

Result<std::string> GenerateControlToken() {
  // 32 random bytes from libsodium, through the CURVE key generator: the
  // secret half of a fresh pair is exactly that, in Z85.
  MERIDIAN_ASSIGN_OR_RETURN(CurveKeyPair pair, GenerateCurveKeyPair());
  return std::move(pair.secret_key);
}

Status WriteControlTokenFile(const std::string& path,
                             const std::string& token) {
  if (!IsZ85Key(token)) return InvalidArgumentError("not a control token");
  std::error_code error;
  std::filesystem::remove(path, error);  // one token per run
  return WriteNewFile(
      path, 0600,
      "# Meridian control token of one run (SHUTDOWN, SET_PEERS): whoever "
      "holds it can stop the job. Keep it private (mode 0600).\n" +
          token + "\n");
}

Result<std::string> ControlToken(std::string_view flag) {
  if (!flag.empty()) {
    return ReadKeyFile(std::string(flag), /*secret=*/true,
                       "control token file");
  }
  const char* env = std::getenv(kControlTokenEnv);
  if (env == nullptr || env[0] == '\0') return std::string();
  if (!IsZ85Key(env)) {
    return InvalidArgumentError(
        std::string("$") + kControlTokenEnv +
        " is not a control token (40 Z85 characters, as `meridian run` "
        "writes to <out>/control.token)");
  }
  return std::string(env);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Only the lengths may leak (tokens have a fixed length).
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return difference == 0;
}

namespace {

// The secret key file `flag` names, else the one $MERIDIAN_SECRET_KEY
// names, else <dir>/<site>.key; nullopt when none applies (`dir` empty).
std::optional<std::string> FindSecretKeyFile(std::string_view flag,
                                             const std::string& dir,
                                             std::string_view site) {
  if (!flag.empty()) return std::string(flag);
  if (const char* env = std::getenv(kSecretKeyEnv);
      env != nullptr && env[0] != '\0') {
    return std::string(env);
  }
  if (!dir.empty()) return dir + "/" + std::string(site) + ".key";
  return std::nullopt;
}

}  // namespace

Result<std::string> SecretKeyPath(const pb::JobConfig& job,
                                  std::string_view site,
                                  std::string_view flag) {
  if (std::optional<std::string> path =
          FindSecretKeyFile(flag, job.security().key_dir(), site)) {
    return *std::move(path);
  }
  return FailedPreconditionError(
      "site '" + std::string(site) +
      "' needs its CURVE secret key file: pass --secret-key FILE, set " +
      kSecretKeyEnv +
      "=FILE, or set security { key_dir: \"DIR\" } in the "
      "job file (the file is then DIR/" +
      std::string(site) + ".key); `meridian keygen --site " +
      std::string(site) +
      " --out DIR` writes one. For local emulation only: security { curve: "
      "false }");
}

namespace {

// The key pair whose secret half is in `path` (a secret key file); errors
// say whose key it is (`who`: "site 'us'").
Result<CurveKeyPair> ReadKeyPair(const std::string& path,
                                 const std::string& who) {
  Result<std::string> secret = ReadSecretKeyFile(path);
  if (!secret.ok()) return secret.status().WithContext(who);
  MERIDIAN_ASSIGN_OR_RETURN(std::string public_key, CurvePublicKeyOf(*secret));
  return CurveKeyPair{std::move(public_key), std::move(*secret)};
}

}  // namespace

bool WorkerCurveEnabled(const pb::JobConfig& job, int site_index) {
  return job.security().curve() &&
         job.site(site_index).has_worker_curve_public_key();
}

Result<std::string> WorkerSecretKeyPath(const pb::JobConfig& job,
                                        std::string_view site,
                                        std::string_view flag) {
  const std::string dir =
      job.security().key_dir().empty()
          ? std::string()
          : job.security().key_dir() + "/" + kWorkerKeySubdir;
  if (std::optional<std::string> path = FindSecretKeyFile(flag, dir, site)) {
    return *std::move(path);
  }
  return FailedPreconditionError(
      "the workers of site '" + std::string(site) +
      "' need their CURVE secret key file (worker_curve_public_key is "
      "set): pass --secret-key FILE, set " +
      kSecretKeyEnv +
      "=FILE, or set security { key_dir: \"DIR\" } in the job file (the "
      "file is then DIR/" +
      kWorkerKeySubdir + "/" + std::string(site) +
      ".key); `meridian keygen --site " + std::string(site) + " --out DIR/" +
      kWorkerKeySubdir + "` writes one");
}

Result<WorkerCurveKeys> LoadWorkerCurveKeys(const pb::JobConfig& job,
                                            int serving_site,
                                            std::string_view secret_key_flag) {
  if (!CurveAvailable()) {
    return UnavailableError(
        "site '" + job.site(serving_site).name() +
        "' lists worker_curve_public_key but this libzmq has no CURVE "
        "support (built without libsodium)");
  }
  const pb::SiteConfig& site = job.site(serving_site);
  if (!IsZ85Key(site.worker_curve_public_key()) ||
      !IsZ85Key(site.curve_public_key())) {
    return FailedPreconditionError(
        "site '" + site.name() +
        "' needs both curve_public_key and worker_curve_public_key (Z85) "
        "for CURVE on its worker endpoint");
  }
  MERIDIAN_ASSIGN_OR_RETURN(
      const std::string path,
      WorkerSecretKeyPath(job, site.name(), secret_key_flag));
  MERIDIAN_ASSIGN_OR_RETURN(
      CurveKeyPair own,
      ReadKeyPair(path, "workers of site '" + site.name() + "'"));
  const std::string& derived = own.public_key;
  if (derived != site.worker_curve_public_key()) {
    const std::string whose =
        derived == site.curve_public_key()
            ? " (that is the site server's own key, not the workers')"
            : "";
    return FailedPreconditionError(
        "the secret key in '" + path + "' belongs to public key " + derived +
        whose + ", but the job file lists " + site.worker_curve_public_key() +
        " for the workers of site '" + site.name() +
        "' (site.worker_curve_public_key): use the workers' key file "
        "(DIR/" +
        kWorkerKeySubdir + "/" + site.name() + ".key) or update the job file");
  }
  WorkerCurveKeys keys;
  keys.own = std::move(own);
  keys.server_public_key = site.curve_public_key();
  return keys;
}

Result<SiteCurveKeys> LoadSiteCurveKeys(const pb::JobConfig& job,
                                        int site_index,
                                        const std::vector<int>& peers,
                                        std::string_view secret_key_flag) {
  if (!CurveAvailable()) {
    return UnavailableError(
        "security.curve is on but this libzmq has no CURVE support (built "
        "without libsodium); install a libzmq with CURVE or set security { "
        "curve: false } for local emulation");
  }
  const pb::SiteConfig& site = job.site(site_index);
  auto missing_key = [](const std::string& name) {
    return FailedPreconditionError(
        "site '" + name +
        "' has no curve_public_key in the job file, and security.curve is "
        "on: run `meridian keygen --site " +
        name +
        " --out DIR` and paste the line it prints into the site's site { }, "
        "or set security { curve: false } for local emulation");
  };
  if (site.curve_public_key().empty()) return missing_key(site.name());
  SiteCurveKeys keys;
  MERIDIAN_ASSIGN_OR_RETURN(const std::string path,
                            SecretKeyPath(job, site.name(), secret_key_flag));
  MERIDIAN_ASSIGN_OR_RETURN(keys.own,
                            ReadKeyPair(path, "site '" + site.name() + "'"));
  const std::string& derived = keys.own.public_key;
  if (derived != site.curve_public_key()) {
    return FailedPreconditionError(
        "the secret key in '" + path + "' belongs to public key " + derived +
        ", but the job file lists " + site.curve_public_key() + " for site '" +
        site.name() +
        "' (site.curve_public_key): use the site's own key file or update "
        "the job file");
  }
  for (int peer : peers) {
    const pb::SiteConfig& other = job.site(peer);
    if (other.curve_public_key().empty()) return missing_key(other.name());
    keys.peers[other.name()] = other.curve_public_key();
  }
  return keys;
}

Status MakeCurveServer(zmq::socket_t& socket, const CurveKeyPair& own) {
  try {
    socket.set(zmq::sockopt::curve_server, true);
    socket.set(zmq::sockopt::curve_secretkey, own.secret_key);
    socket.set(zmq::sockopt::zap_domain, kZapDomain);
  } catch (const zmq::error_t& error) {
    return InvalidArgumentError(
        std::string("cannot make the socket a CURVE server: ") + error.what());
  }
  // Fail closed: without a handler, refuse rather than admit every key.
  const int on = 1;
  if (zmq_setsockopt(socket.handle(), kZapEnforceDomain, &on, sizeof(on)) !=
      0) {
    MLOG(WARNING) << "this libzmq cannot enforce ZAP "
                     "(ZMQ_ZAP_ENFORCE_DOMAIN: "
                  << ErrnoText(zmq_errno())
                  << "): keep the ZAP handler running while the socket is "
                     "open";
  }
  return Status::Ok();
}

Status MakeCurveClient(zmq::socket_t& socket, const CurveKeyPair& own,
                       std::string_view server_public_key) {
  if (!IsZ85Key(server_public_key)) {
    return InvalidArgumentError("the server's CURVE public key '" +
                                std::string(server_public_key) +
                                "' is not a Z85 key");
  }
  try {
    socket.set(zmq::sockopt::curve_serverkey, server_public_key);
    socket.set(zmq::sockopt::curve_publickey, own.public_key);
    socket.set(zmq::sockopt::curve_secretkey, own.secret_key);
  } catch (const zmq::error_t& error) {
    return InvalidArgumentError(
        std::string("cannot make the socket a CURVE client: ") + error.what());
  }
  return Status::Ok();
}

// ---- ZAP handler ------------------------------------------------------------

Result<std::unique_ptr<ZapHandler>> ZapHandler::Start(
    zmq::context_t& context, std::map<std::string, std::string> allowed,
    std::string owner) {
  for (const auto& [key, name] : allowed) {
    if (!IsZ85Key(key)) {
      return InvalidArgumentError("the CURVE public key of '" + name +
                                  "' is not a Z85 key: '" + key + "'");
    }
  }
  try {
    zmq::socket_t socket(context, zmq::socket_type::rep);
    socket.set(zmq::sockopt::linger, kSocketCloseLingerMs);
    socket.bind(kZapEndpoint);
    return std::unique_ptr<ZapHandler>(new ZapHandler(
        std::move(socket), std::move(allowed), std::move(owner)));
  } catch (const zmq::error_t& error) {
    if (error.num() == EADDRINUSE) {
      return FailedPreconditionError(
          "a ZAP handler already serves this ZeroMQ context (" + owner + ")");
    }
    return UnavailableError(std::string("cannot start the ZAP handler: ") +
                            error.what());
  }
}

ZapHandler::ZapHandler(zmq::socket_t socket,
                       std::map<std::string, std::string> allowed,
                       std::string owner)
    : socket_(std::move(socket)),
      allowed_(std::move(allowed)),
      owner_(std::move(owner)) {
  // The thread owns socket_ from here on (thread creation is the memory
  // barrier ZeroMQ needs to move a socket between threads).
  thread_ = std::thread([this] { Serve(); });
}

ZapHandler::~ZapHandler() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void ZapHandler::Serve() {
  try {
    std::vector<zmq::message_t> request;
    while (!stop_.load()) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, kZapPoll);
      if (!(item.revents & ZMQ_POLLIN)) continue;
      request.clear();
      bool more = true;
      while (more) {
        zmq::message_t frame;
        if (!socket_.recv(frame, zmq::recv_flags::dontwait)) break;
        more = frame.more();
        request.push_back(std::move(frame));
      }
      if (request.empty()) continue;
      Answer(request);
    }
  } catch (const zmq::error_t& error) {
    if (error.num() != ETERM) {
      MLOG(ERROR) << owner_ << ": the ZAP handler stopped: " << error.what()
                  << "; new CURVE connections are refused from now on";
    }
  }
  socket_.close();
}

void ZapHandler::Answer(std::vector<zmq::message_t>& request) {
  // RFC 27 request: version, request id, domain, address, identity,
  // mechanism, credentials...
  auto text = [&](size_t i) {
    return i < request.size() ? request[i].to_string() : std::string();
  };
  std::string status = "400";
  std::string status_text = "not allowed";
  std::string user_id;
  if (request.size() < 6 || text(0) != "1.0") {
    status = "500";
    status_text = "malformed ZAP request";
    MLOG(ERROR) << owner_ << ": malformed ZAP request (" << request.size()
                << " frames)";
  } else {
    const std::string address = text(3);
    const std::string mechanism = text(5);
    if (mechanism == "CURVE" && request.size() >= 7 &&
        request[6].size() == kCurveKeyBytes) {
      const std::string key = Z85Of(request[6]);
      const auto it = allowed_.find(key);
      if (it != allowed_.end()) {
        status = "200";
        status_text = "OK";
        user_id = it->second;
        admitted_.fetch_add(1);
        MLOG(INFO) << owner_ << ": admitted '" << it->second << "' (CURVE key "
                   << key << ") from " << address;
      } else {
        refused_.fetch_add(1);
        MLOG(WARNING) << owner_ << ": refused a CURVE connection from "
                      << address << ": key " << key
                      << " is not listed in the job for it";
      }
    } else if (mechanism == "NULL") {
      status = "200";
      status_text = "OK";
      admitted_.fetch_add(1);
    } else {
      refused_.fetch_add(1);
      MLOG(WARNING) << owner_ << ": refused a " << mechanism
                    << " connection from " << address
                    << ": only CURVE keys listed in the job are admitted";
    }
  }
  // Reply: version, request id, status code, status text, user id,
  // metadata.
  std::array<std::string, 6> reply = {"1.0",       text(1), status,
                                      status_text, user_id, ""};
  for (size_t i = 0; i < reply.size(); ++i) {
    socket_.send(zmq::buffer(reply[i]), i + 1 < reply.size()
                                            ? zmq::send_flags::sndmore
                                            : zmq::send_flags::none);
  }
}

}  // namespace meridian
