// The worker and evaluator programs of a job (WorkerGroup.command,
// EvaluatorConfig.command) as processes: where each program is found, the
// directory it runs in, and the MERIDIAN_* environment it learns its place
// in the job from (docs/operations.md, "Worker and evaluator programs").
// `meridian run` (launcher.cc) and `meridian site --with-workers`
// (site_workers.cc) both start programs through this, so a program gets
// the same variables from either.
//
// Functions of the job and a ProgramContext, plus lookups in the file
// system and $PATH at the time of the call; no state, any thread.
#ifndef MERIDIAN_LAUNCH_PROGRAMS_H_
#define MERIDIAN_LAUNCH_PROGRAMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "meridian/core/process.h"
#include "meridian/core/status.h"
#include "meridian/job.pb.h"

namespace meridian {

// Where the programs of one job run; the same for all of them.
struct ProgramContext {
  // MERIDIAN_JOB: the job file the program reads, absolute (the one the
  // launcher's own children read: under `meridian run` with ephemeral
  // CURVE keys, the derived OUT/job.pbtxt).
  std::string job_path;
  // The programs' working directory, and what relative program paths are
  // relative to: the directory of the job file the user gave (absolute).
  std::string job_dir;
  // MERIDIAN_OUT: the run's output directory, absolute.
  std::string out_dir;
};

// A context with every path made absolute (against this process's working
// directory): `job_path` the file the children read, `given_job_path` the
// file the user gave (its directory is job_dir), `out_dir`.
ProgramContext MakeProgramContext(const std::string& job_path,
                                  const std::string& given_job_path,
                                  const std::string& out_dir);

// One process of a program, ready for ChildProcess::Spawn.
struct ProgramProcess {
  // The command with argv[0] replaced by the program's path as found.
  std::vector<std::string> argv;
  SpawnOptions spawn;  // job_dir and the MERIDIAN_* variables
  // The command as the job file gives it ("python3 train.py --lr 0.1"),
  // for names and messages.
  std::string command;
};

// The evaluator command of site `site`: the site's own evaluator { }, else
// the job's; empty: the site runs no evaluator. Sites without a server of
// their own have none.
std::vector<std::string> EvaluatorCommand(const pb::JobConfig& job, int site);

// Finds `program` as execvp would for a process started in `working_dir`:
// a name without '/' in each directory of `search_path` (PATH's value;
// null: "/bin:/usr/bin", execvp's default; relative entries, "" among
// them, against working_dir), the first executable regular file; a name
// with '/' is that path (relative ones against working_dir). NotFound
// naming the program and every place looked in; FailedPrecondition when
// the file exists but is a directory or not executable.
Result<std::string> FindProgram(const std::string& program,
                                const std::string& working_dir,
                                const char* search_path);

// FindJobPrograms (meridian/launch/launcher.h) finds every program of a
// job before anything starts.

// Worker `index` of site `site`, whose group has a command; `connect` is
// MERIDIAN_CONNECT (the endpoint `meridian worker --connect` would get).
Result<ProgramProcess> WorkerProgram(const pb::JobConfig& job,
                                     const ProgramContext& context, int site,
                                     uint32_t index,
                                     const std::string& connect);

// The evaluator of site `site` (EvaluatorCommand non-empty); `connect` is
// the site server's worker endpoint.
Result<ProgramProcess> EvaluatorProgram(const pb::JobConfig& job,
                                        const ProgramContext& context, int site,
                                        const std::string& connect);

// The program that writes an EXTERNAL model's missing weights file
// (model.weights_command, non-empty): MERIDIAN_ROLE=weights, the job's
// MERIDIAN_JOB, MERIDIAN_WEIGHTS, MERIDIAN_SEED, MERIDIAN_SITE_COUNT and
// MERIDIAN_OUT; no site of its own.
Result<ProgramProcess> WeightsProgram(const pb::JobConfig& job,
                                      const ProgramContext& context);

}  // namespace meridian

#endif  // MERIDIAN_LAUNCH_PROGRAMS_H_
