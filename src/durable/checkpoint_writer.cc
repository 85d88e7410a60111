#include "durable/checkpoint_writer.h"

#include <chrono>
#include <exception>
#include <utility>

#include "durable/checkpoint_dir.h"

namespace meridian {

CheckpointWriter::CheckpointWriter(CheckpointWriterOptions options)
    : dir_(std::move(options.dir)),
      write_(options.write
                 ? std::move(options.write)
                 : std::function<Status(const std::string&, const Checkpoint&)>(
                       WriteCheckpoint)),
      durable_sequence_(options.durable_sequence) {
  thread_ = std::thread([this] { Run(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool CheckpointWriter::Submit(Checkpoint&& checkpoint) {
  std::optional<Checkpoint> replaced;  // freed outside the lock
  {
    MutexLock lock(&mu_);
    replaced = std::exchange(pending_, std::move(checkpoint));
    pending_ticket_ = next_ticket_++;
    if (replaced.has_value()) ++stats_.replaced;
  }
  cv_.notify_all();
  return replaced.has_value();
}

Status CheckpointWriter::Flush() {
  MutexLock lock(&mu_);
  const uint64_t ticket = next_ticket_ - 1;
  while (done_ticket_ < ticket && !stop_) cv_.wait(mu_);
  return last_error_;
}

Status CheckpointWriter::last_error() const {
  MutexLock lock(&mu_);
  return last_error_;
}

CheckpointWriter::Stats CheckpointWriter::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void CheckpointWriter::Run() {
  for (;;) {
    std::optional<Checkpoint> checkpoint;
    uint64_t ticket = 0;
    {
      MutexLock lock(&mu_);
      while (!stop_ && !pending_.has_value()) cv_.wait(mu_);
      if (stop_) return;  // a pending checkpoint is dropped
      checkpoint = std::exchange(pending_, std::nullopt);
      ticket = pending_ticket_;
    }
    Status status;
    const auto started = std::chrono::steady_clock::now();
    try {
      status = write_(dir_, *checkpoint);
    } catch (const std::exception& e) {
      status =
          InternalError("checkpoint " + std::to_string(checkpoint->sequence) +
                        " not written: " + e.what());
    }
    if (status.ok()) {
      durable_sequence_.store(checkpoint->sequence, std::memory_order_release);
    }
    settled_sequence_.store(checkpoint->sequence, std::memory_order_release);
    const double took_s = std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - started)
                              .count();
    checkpoint.reset();  // at most two snapshots: free this one first
    {
      MutexLock lock(&mu_);
      done_ticket_ = ticket;
      stats_.last_write_s = took_s;
      last_error_ = status;
      if (status.ok()) {
        ++stats_.written;
      } else {
        ++stats_.failed;
      }
    }
    cv_.notify_all();
  }
}

}  // namespace meridian
