#include "launch/programs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include "meridian/config/config.h"
#include "meridian/launch/launcher.h"
#include "meridian/net/security.h"

namespace meridian {
namespace {

namespace fs = std::filesystem;

// execvp's search path when PATH is unset (confstr(_CS_PATH) on glibc).
constexpr const char* kDefaultSearchPath = "/bin:/usr/bin";

// The variables a program may be given; those that do not apply to a
// process are removed from what it inherits, so that it never reads a
// stale one (e.g. `meridian site`'s own $MERIDIAN_SECRET_KEY).
constexpr const char* kProgramVariables[] = {
    "MERIDIAN_ROLE", "MERIDIAN_JOB", "MERIDIAN_SITE", "MERIDIAN_SITE_INDEX",
    "MERIDIAN_SITE_COUNT", "MERIDIAN_WORKER_INDEX", "MERIDIAN_WORKER_COUNT",
    "MERIDIAN_CONNECT", "MERIDIAN_WEIGHTS", "MERIDIAN_SECRET_KEY",
    "MERIDIAN_SERVER_PUBLIC_KEY", "MERIDIAN_STEP_TIME_S", "MERIDIAN_SEED",
    "MERIDIAN_OUT",
    // The site's secret, never a program's.
    "MERIDIAN_CONTROL_TOKEN"};

std::string Absolute(const std::string& path) {
  std::error_code error;
  const fs::path absolute = fs::absolute(path, error);
  return error ? path : absolute.lexically_normal().string();
}

std::string FormatDouble(double value) {
  char buffer[64];
  const auto [end, error] =
      std::to_chars(buffer, buffer + sizeof(buffer), value);
  return error == std::errc() ? std::string(buffer, end) : "0";
}

// Why `path` cannot be executed ("" when it can).
std::string NotExecutable(const fs::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return "does not exist";
  if (S_ISDIR(info.st_mode)) return "is a directory";
  if (!S_ISREG(info.st_mode)) return "is not a regular file";
  if (::access(path.c_str(), X_OK) != 0) return "is not executable";
  return "";
}

// The MERIDIAN_* variables every program gets; `role` and the rest are
// added by the caller.
class Environment {
 public:
  // A program of site `site`.
  Environment(const pb::JobConfig& job, const ProgramContext& context,
              const char* role, int site)
      : Environment(job, context, role) {
    Set("MERIDIAN_SITE", job.site(site).name());
    Set("MERIDIAN_SITE_INDEX", std::to_string(site));
  }
  // A program of the whole job (model.weights_command).
  Environment(const pb::JobConfig& job, const ProgramContext& context,
              const char* role) {
    Set("MERIDIAN_ROLE", role);
    Set("MERIDIAN_JOB", context.job_path);
    Set("MERIDIAN_SITE_COUNT", std::to_string(job.site_size()));
    if (!job.model().weights().empty()) {
      Set("MERIDIAN_WEIGHTS", Absolute(job.model().weights()));
    }
    Set("MERIDIAN_SEED", std::to_string(job.seed()));
    Set("MERIDIAN_OUT", context.out_dir);
  }

  void Set(const std::string& name, const std::string& value) {
    spawn_.set_environment.push_back(name + "=" + value);
  }

  // The workers' CURVE key of the server of site `serving` (what `meridian
  // worker` would read there), when its worker endpoint is CURVE.
  Status SetWorkerKeys(const pb::JobConfig& job, int serving) {
    if (!WorkerCurveEnabled(job, serving)) return Status::Ok();
    const pb::SiteConfig& site = job.site(serving);
    MERIDIAN_ASSIGN_OR_RETURN(const std::string key,
                              WorkerSecretKeyPath(job, site.name(), ""));
    Set("MERIDIAN_SECRET_KEY", Absolute(key));
    Set("MERIDIAN_SERVER_PUBLIC_KEY", site.curve_public_key());
    return Status::Ok();
  }

  // Every other program variable is removed from what the child inherits.
  SpawnOptions Finish(const ProgramContext& context) {
    spawn_.working_dir = context.job_dir;
    for (const char* name : kProgramVariables) {
      bool set = false;
      for (const std::string& entry : spawn_.set_environment) {
        set |= entry.compare(0, entry.find('='), name) == 0;
      }
      if (!set) spawn_.unset_environment.push_back(name);
    }
    return std::move(spawn_);
  }

 private:
  SpawnOptions spawn_;
};

// `command` with its program found from the job file's directory.
Result<ProgramProcess> Resolve(const std::vector<std::string>& command,
                               const ProgramContext& context) {
  MERIDIAN_ASSIGN_OR_RETURN(
      std::string program,
      FindProgram(command.front(), context.job_dir, std::getenv("PATH")));
  ProgramProcess process;
  process.argv = command;
  process.argv.front() = std::move(program);
  process.command = DescribeCommand(command);
  return process;
}

}  // namespace

ProgramContext MakeProgramContext(const std::string& job_path,
                                  const std::string& given_job_path,
                                  const std::string& out_dir) {
  ProgramContext context;
  context.job_path = Absolute(job_path);
  context.job_dir = fs::path(Absolute(given_job_path)).parent_path().string();
  context.out_dir = Absolute(out_dir);
  return context;
}

std::vector<std::string> EvaluatorCommand(const pb::JobConfig& job, int site) {
  const pb::SiteConfig& config = job.site(site);
  if (!HasServer(config)) return {};
  const pb::EvaluatorConfig& evaluator =
      config.has_evaluator() ? config.evaluator() : job.evaluator();
  return {evaluator.command().begin(), evaluator.command().end()};
}

Result<std::string> FindProgram(const std::string& program,
                                const std::string& working_dir,
                                const char* search_path) {
  if (program.empty()) return InvalidArgumentError("empty program name");
  if (program.find('/') != std::string::npos) {
    const fs::path path = fs::path(working_dir) / program;  // absolute wins
    const std::string problem = NotExecutable(path);
    if (problem.empty()) return path.lexically_normal().string();
    const std::string what =
        path.lexically_normal().string() + " " + problem +
        (fs::path(program).is_absolute()
             ? ""
             : " (relative paths are relative to the job file's directory)");
    return problem == "does not exist" ? NotFoundError(what)
                                       : FailedPreconditionError(what);
  }
  const std::string directories =
      search_path != nullptr ? search_path : kDefaultSearchPath;
  std::string unusable;  // the first match that cannot be run, and why
  size_t begin = 0;
  while (begin <= directories.size()) {
    size_t end = directories.find(':', begin);
    if (end == std::string::npos) end = directories.size();
    const std::string directory = directories.substr(begin, end - begin);
    begin = end + 1;
    const fs::path path =
        fs::path(working_dir) / (directory.empty() ? "." : directory) / program;
    const std::string problem = NotExecutable(path);
    if (problem.empty()) return path.lexically_normal().string();
    if (problem != "does not exist" && unusable.empty()) {
      unusable = path.lexically_normal().string() + " " + problem;
    }
  }
  const std::string searched =
      "PATH " + (search_path != nullptr ? "'" + directories + "'"
                                        : "unset, so '" + directories + "'");
  if (!unusable.empty()) {
    return FailedPreconditionError("no executable '" + program + "' in " +
                                   searched + ": " + unusable);
  }
  return NotFoundError("no '" + program + "' in any directory of " + searched);
}

Status FindJobPrograms(const pb::JobConfig& job, const std::string& config_path,
                       int site_index) {
  const std::string job_dir =
      MakeProgramContext(config_path, config_path, ".").job_dir;
  auto find = [&](const std::vector<std::string>& command,
                  const std::string& field, const std::string& what) {
    if (command.empty()) return Status::Ok();
    Result<std::string> found =
        FindProgram(command.front(), job_dir, std::getenv("PATH"));
    if (found.ok()) return Status::Ok();
    return Status(found.status().code(),
                  field + ": cannot start " + what + " '" +
                      DescribeCommand(command) +
                      "': " + found.status().message() +
                      "; programs run in the job file's directory " + job_dir);
  };
  MERIDIAN_RETURN_IF_ERROR(find({job.model().weights_command().begin(),
                                 job.model().weights_command().end()},
                                "model.weights_command",
                                "the program that writes the weights"));
  for (int s = 0; s < job.site_size(); ++s) {
    if (site_index >= 0 && s != site_index) continue;
    const pb::SiteConfig& site = job.site(s);
    for (int g = 0; g < site.workers_size(); ++g) {
      const auto& command = site.workers(g).command();
      MERIDIAN_RETURN_IF_ERROR(
          find({command.begin(), command.end()},
               "site[" + std::to_string(s) + "].workers[" + std::to_string(g) +
                   "].command",
               "the worker program of site '" + site.name() + "'"));
    }
    MERIDIAN_RETURN_IF_ERROR(
        find(EvaluatorCommand(job, s),
             site.has_evaluator()
                 ? "site[" + std::to_string(s) + "].evaluator.command"
                 : std::string("evaluator.command"),
             "the evaluator of site '" + site.name() + "'"));
  }
  return Status::Ok();
}

Result<ProgramProcess> WorkerProgram(const pb::JobConfig& job,
                                     const ProgramContext& context, int site,
                                     uint32_t index,
                                     const std::string& connect) {
  const pb::WorkerGroup& group = WorkerGroupOf(job.site(site), index);
  MERIDIAN_ASSIGN_OR_RETURN(
      ProgramProcess process,
      Resolve({group.command().begin(), group.command().end()}, context));
  Environment environment(job, context, "worker", site);
  environment.Set("MERIDIAN_WORKER_INDEX", std::to_string(index));
  environment.Set("MERIDIAN_WORKER_COUNT",
                  std::to_string(SiteWorkerCount(job.site(site))));
  environment.Set("MERIDIAN_CONNECT", connect);
  environment.Set("MERIDIAN_STEP_TIME_S", FormatDouble(group.step_time_s()));
  MERIDIAN_RETURN_IF_ERROR(
      environment.SetWorkerKeys(job, ServingSite(job, site)));
  process.spawn = environment.Finish(context);
  return process;
}

Result<ProgramProcess> EvaluatorProgram(const pb::JobConfig& job,
                                        const ProgramContext& context, int site,
                                        const std::string& connect) {
  MERIDIAN_ASSIGN_OR_RETURN(ProgramProcess process,
                            Resolve(EvaluatorCommand(job, site), context));
  Environment environment(job, context, "evaluator", site);
  environment.Set("MERIDIAN_CONNECT", connect);
  MERIDIAN_RETURN_IF_ERROR(environment.SetWorkerKeys(job, site));
  process.spawn = environment.Finish(context);
  return process;
}

std::string DescribeCommand(const std::vector<std::string>& command) {
  std::string text;
  for (const std::string& arg : command) {
    if (!text.empty()) text += ' ';
    const bool quote =
        arg.empty() || arg.find_first_of(" \t'\"") != std::string::npos;
    text += quote ? "'" + arg + "'" : arg;
  }
  return text;
}

Result<ProgramProcess> WeightsProgram(const pb::JobConfig& job,
                                      const ProgramContext& context) {
  const auto& command = job.model().weights_command();
  MERIDIAN_ASSIGN_OR_RETURN(ProgramProcess process,
                            Resolve({command.begin(), command.end()}, context));
  Environment environment(job, context, "weights");
  process.spawn = environment.Finish(context);
  return process;
}

}  // namespace meridian
