// Durable state of a site server, so that it survives a crash: checkpoints
// (a snapshot of everything the site needs to continue), an append-only log
// of records written between checkpoints (the outgoing-update log), and a
// background thread that writes checkpoints while training goes on. The
// rooms above (sync, site) include this header; each piece has its own:
//
//   checkpoint_codec.h   a Checkpoint and the bytes of its file
//   checkpoint_dir.h     a directory of checkpoint files: write, load, prune
//   checkpoint_writer.h  CheckpointWriter, the background thread
//   log_format.h         the log's segment files
//   log_writer.h         LogWriter: appending to the log
//   log_reader.h         ReadLog: the log read back after a crash
//   fingerprint.h        which job and site a file belongs to
// and, private to this room, coding.h (little-endian integers, CRC-32) and
// file_util.h (POSIX helpers).
//
// Failure model. Any process may die at any moment (kill -9 mid-write), and
// files may be truncated or corrupt. Nothing here crashes or allocates
// without bound on bad bytes: every length read from a file is checked
// against the bytes actually there before anything is allocated, and every
// refusal is a Status naming the file and what is wrong with it.
//
// One directory, one writer. A checkpoint directory and a log directory
// (they may be the same) belong to one site of one job, written by one
// process at a time; files of another job or site in it are refused on
// load (the fingerprint), never silently used. Readers may run while no
// writer does (at start-up, before the writer is created).
//
// Temporary files (`ckpt-<hex>.tmp`, `log-<hex>.tmp`) are left only by a
// crash mid-write; readers ignore them and the next writer deletes them.
// Other files in the directories are ignored and left alone.
#ifndef MERIDIAN_DURABLE_CHECKPOINT_H_
#define MERIDIAN_DURABLE_CHECKPOINT_H_

#include "durable/checkpoint_codec.h"
#include "durable/checkpoint_dir.h"
#include "durable/checkpoint_writer.h"
#include "durable/fingerprint.h"
#include "durable/log_format.h"
#include "durable/log_reader.h"
#include "durable/log_writer.h"

#endif  // MERIDIAN_DURABLE_CHECKPOINT_H_
