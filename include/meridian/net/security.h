// Encrypted, authenticated site-to-site links with ZeroMQ CURVE
// (rfc.zeromq.org/spec/26, CurveZMQ) and a ZAP handler
// (rfc.zeromq.org/spec/27) that admits only the keys a job lists.
//
// Keys are Z85 text (40 characters for 32 bytes), as zmq_curve_keypair
// writes them. A site's public key lives in the job file
// (site.curve_public_key); its secret key only ever in a file of its own,
// readable by its owner alone:
//
//   <dir>/<site>.key   mode 0600   "# ..." comment lines, then the secret key
//   <dir>/<site>.pub   mode 0644   "# ..." comment lines, then the public key
//
// Which sockets use it: a site server's mirror socket (ROUTER) is a CURVE
// server with the site's secret key, and its ZAP handler admits the public
// keys of the sites it syncs with; each channel to a peer (DEALER) is a
// CURVE client with the site's key pair and the peer's public key. A
// site's worker endpoint (ROUTER) is plaintext unless the site lists
// worker_curve_public_key: then it is a CURVE server with the site's own
// key pair, in a ZeroMQ context of its own with its own ZAP handler that
// admits only that key, and each of its workers (DEALER) is a CURVE client
// with the worker key pair (one per site, shared by its workers:
// <key_dir>/workers/<site>.key) and the site's public key. Without it,
// workers and their site server talk in plaintext (one LAN), and so do
// workers of a site with server_site (the BSP-over-WAN baseline; see
// README) unless the serving site lists a worker key.
//
// Order matters: libzmq asks a ZAP handler only when one is bound in the
// socket's context when a client connects, and a CURVE server without one
// admits every client key. Start the ZapHandler before binding a CURVE
// server socket (MakeCurveServer also asks libzmq to refuse clients when no
// handler answers) and destroy it after closing the socket.
#ifndef MERIDIAN_NET_SECURITY_H_
#define MERIDIAN_NET_SECURITY_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "meridian/job.pb.h"
#include "meridian/core/status.h"
#include "meridian/core/z85.h"  // IsZ85Key, kCurveKeyZ85Length

namespace meridian {

// The environment variable a site role reads its secret key file from
// (after --secret-key, before security.key_dir).
inline constexpr const char* kSecretKeyEnv = "MERIDIAN_SECRET_KEY";

// Control tokens (wire.proto Header.control_token): a site server obeys
// SHUTDOWN and SET_PEERS only when they carry its token. `meridian run`
// makes one per run, writes it to <out>/control.token (mode 0600, the
// secret key file format) and hands the file to its site servers
// (--control-token-file); a standalone `meridian site` takes the file, or
// the token itself in $MERIDIAN_CONTROL_TOKEN.
inline constexpr const char* kControlTokenEnv = "MERIDIAN_CONTROL_TOKEN";

// 32 random bytes (libsodium), as 40 Z85 characters.
Result<std::string> GenerateControlToken();
// Writes `token` to `path` (mode 0600), replacing an older token file.
Status WriteControlTokenFile(const std::string& path, const std::string& token);
// The token of a site role: read from the file `flag` when non-empty
// (checked like a secret key file), else $MERIDIAN_CONTROL_TOKEN, else
// empty (no control message will be obeyed).
Result<std::string> ControlToken(std::string_view flag);
// Compares in time that depends only on the lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// A CURVE key pair, both halves Z85 text.
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;
};

// Whether this libzmq was built with CURVE (libsodium).
bool CurveAvailable();

// A fresh key pair (zmq_curve_keypair). Unavailable when libzmq has no
// CURVE.
Result<CurveKeyPair> GenerateCurveKeyPair();

// The public key that belongs to `secret_key` (zmq_curve_public).
Result<std::string> CurvePublicKeyOf(std::string_view secret_key);

// Writes <dir>/<name>.key (mode 0600) and <dir>/<name>.pub (mode 0644),
// creating `dir` (mode 0700) when missing. Refuses (AlreadyExists as
// FailedPrecondition, naming the file) to overwrite either file, so a key
// pair that peers already trust is never lost by mistake.
Status WriteCurveKeyFiles(const std::string& dir, const std::string& name,
                          const CurveKeyPair& pair);

// Reads a secret key file. Refuses a file that is not a regular file, or
// whose mode grants anything to group or others (the error names the file,
// its mode and the chmod that fixes it), or that does not hold exactly one
// valid Z85 key line (lines starting with '#' and blank lines are skipped).
Result<std::string> ReadSecretKeyFile(const std::string& path);

// Reads a public key file (same format; no permission check).
Result<std::string> ReadPublicKeyFile(const std::string& path);

// The secret key file of site `site`: `flag` when non-empty, else
// $MERIDIAN_SECRET_KEY when set, else <security.key_dir>/<site>.key.
// FailedPrecondition (saying how to provide one) when none applies.
Result<std::string> SecretKeyPath(const pb::JobConfig& job,
                                  std::string_view site, std::string_view flag);

// Where security.key_dir keeps the workers' key files:
// <key_dir>/workers/<site>.key, the key pair of the workers of <site>'s
// server.
inline constexpr const char* kWorkerKeySubdir = "workers";

// Whether the worker endpoint of site `site_index` is a CURVE server:
// security.curve is on and the site lists worker_curve_public_key.
bool WorkerCurveEnabled(const pb::JobConfig& job, int site_index);

// The worker secret key file for the server of site `site` (the site whose
// server the worker connects to: its own, or its server_site): `flag` when
// non-empty, else $MERIDIAN_SECRET_KEY when set, else
// <security.key_dir>/workers/<site>.key. FailedPrecondition (saying how to
// provide one) when none applies.
Result<std::string> WorkerSecretKeyPath(const pb::JobConfig& job,
                                        std::string_view site,
                                        std::string_view flag);

// What a worker needs to reach a CURVE worker endpoint.
struct WorkerCurveKeys {
  CurveKeyPair own;               // the worker key pair
  std::string server_public_key;  // the serving site's curve_public_key
};

// Loads the worker key of the server of site `serving_site`
// (WorkerSecretKeyPath) and checks that it belongs to the site's
// worker_curve_public_key. Precondition: WorkerCurveEnabled(job,
// serving_site). Errors name the site, the file and how to fix it (a
// file holding the site's own secret key says so).
Result<WorkerCurveKeys> LoadWorkerCurveKeys(const pb::JobConfig& job,
                                            int serving_site,
                                            std::string_view secret_key_flag);

// The keys one site needs for its CURVE links.
struct SiteCurveKeys {
  CurveKeyPair own;
  // Public key of every peer the site talks to, by site name.
  std::map<std::string, std::string> peers;
};

// Loads site `site_index`'s secret key (SecretKeyPath), checks that it
// belongs to the public key the job lists for the site, and collects the
// listed public keys of `peers` (site indices). Every error names the
// site, the file or the missing job-file field and how to fix it.
Result<SiteCurveKeys> LoadSiteCurveKeys(const pb::JobConfig& job,
                                        int site_index,
                                        const std::vector<int>& peers,
                                        std::string_view secret_key_flag);

// Socket set-up; call before bind / connect. Errors name the socket role.
// A CURVE server with `own`'s keys, in ZAP domain "meridian", that refuses
// clients when no ZAP handler is bound (ZMQ_ZAP_ENFORCE_DOMAIN, which
// libzmq 4.3 honours only together with a domain).
Status MakeCurveServer(zmq::socket_t& socket, const CurveKeyPair& own);
// A CURVE client with `own`'s keys that only talks to the server holding
// the secret key of `server_public_key`.
Status MakeCurveClient(zmq::socket_t& socket, const CurveKeyPair& own,
                       std::string_view server_public_key);

// The ZAP handler of one zmq::context_t: a thread owning a REP socket bound
// to inproc://zeromq.zap.01 that answers libzmq's authentication requests.
// A CURVE request is admitted (200, user id = the key's name) iff the
// client's public key is in the allowed set; otherwise refused (400) and
// logged as a warning with the peer's address and key. NULL-mechanism
// requests (only made by sockets that set a ZAP domain, which Meridian's
// plaintext sockets do not) are admitted: plaintext sockets are plaintext
// by choice. Other mechanisms are refused.
//
// Thread-safety: the allowed set is fixed at Start and only read by the
// handler thread; the counters may be read from any thread. Ownership: the
// context is not owned and must outlive the handler; destroy the handler
// (which stops and joins its thread within ~100 ms) before terminating the
// context. If the context is terminated first, the thread exits on ETERM.
class ZapHandler {
 public:
  // `allowed`: Z85 public key -> name (a site name), used as the ZAP user
  // id and in log lines. `owner` names who is protected, for log lines
  // (e.g. "mirror socket of site 'us'"). Fails when the context already has
  // a ZAP handler or a key is not valid Z85.
  static Result<std::unique_ptr<ZapHandler>> Start(
      zmq::context_t& context, std::map<std::string, std::string> allowed,
      std::string owner);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  uint64_t admitted() const { return admitted_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  ZapHandler(zmq::socket_t socket, std::map<std::string, std::string> allowed,
             std::string owner);
  void Serve();
  // Answers one request (frames as received).
  void Answer(std::vector<zmq::message_t>& request);

  // Threads: the owner's thread runs Start, the constructor and the
  // destructor; thread_ (the handler) runs Serve and Answer. Nothing is
  // shared under a lock: what both touch is either fixed before thread_
  // starts or atomic.
  zmq::socket_t socket_;  // the handler's alone once thread_ runs
  const std::map<std::string, std::string> allowed_;  // fixed before thread_
  const std::string owner_;                           // fixed before thread_
  std::atomic<bool> stop_{false};      // set by the destructor, read by thread_
  std::atomic<uint64_t> admitted_{0};  // written by thread_, read by any
  std::atomic<uint64_t> refused_{0};   // written by thread_, read by any
  std::thread thread_;                 // the owner's: started, joined
};

}  // namespace meridian

#endif  // MERIDIAN_NET_SECURITY_H_
