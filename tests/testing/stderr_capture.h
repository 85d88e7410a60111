// Captures this process's stderr while a test waits for a line to appear in
// it. Unlike GoogleTest's CaptureStderr, the text can be read while the
// capture goes on, so a test waits for the line itself (with a deadline
// generous enough for a loaded machine) instead of for a fixed time after
// which it hopes the line was written. Header-only.
#ifndef MERIDIAN_TESTING_STDERR_CAPTURE_H_
#define MERIDIAN_TESTING_STDERR_CAPTURE_H_

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <thread>

#include "testing/text.h"

namespace meridian::testing {

// How long a test waits for an event that happens within milliseconds on
// an idle machine: long enough for a 2-core machine busy with other work
// (an event loop was seen not to run for 7 s there).
inline constexpr std::chrono::seconds kEventDeadline{60};

// Polls `done` every 10 ms until it returns true or `deadline` passes;
// returns its last answer.
template <typename Predicate>
bool WaitUntil(Predicate done,
               std::chrono::milliseconds deadline = kEventDeadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// While alive, file descriptor 2 writes to a temporary file (every thread's
// stderr, std::cerr and MLOG included). One at a time per process; not
// thread-safe itself (the test's thread owns it).
class StderrCapture {
 public:
  StderrCapture() {
    char path[] = "/tmp/meridian-stderr-XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0) return;
    path_ = path;
    std::cerr.flush();
    std::fflush(stderr);
    saved_ = ::dup(2);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~StderrCapture() {
    Stop();
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  // Everything written so far.
  std::string Text() const {
    std::cerr.flush();
    std::fflush(stderr);
    return path_.empty() ? std::string() : ReadFile(path_);
  }
  // Whether `part` appeared within `deadline`.
  bool WaitFor(std::string_view part,
               std::chrono::milliseconds deadline = kEventDeadline) const {
    return WaitUntil([&] { return Contains(Text(), part); }, deadline);
  }
  // Restores stderr; returns everything captured (later calls: the same).
  std::string Stop() {
    if (saved_ >= 0) {
      captured_ = Text();
      ::dup2(saved_, 2);
      ::close(saved_);
      saved_ = -1;
    }
    return captured_;
  }

 private:
  std::string path_;
  int saved_ = -1;
  std::string captured_;
};

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTING_STDERR_CAPTURE_H_
