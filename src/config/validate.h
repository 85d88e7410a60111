// The validation of a job file, one function per section of pb::JobConfig
// (ValidateJobConfig in config.cc calls them in order). Each records what
// is wrong through an IssueReporter (issue_reporter.h) under the path it is
// given and checks every field, so that one pass reports every issue.
//   validate_sites.cc     site {}
//   validate_training.cc  model {}, data {}, optimizer {}, server {},
//                         policy {}
//   validate_wan.cc       wan {}, fault {}
//   validate_sync.cc      sync {}
//   validate_security.cc  security {} and the sites' keys
//   validate_programs.cc  worker and evaluator programs, model.kind
//                         EXTERNAL (weights, metrics, target)
#ifndef MERIDIAN_CONFIG_VALIDATE_H_
#define MERIDIAN_CONFIG_VALIDATE_H_

#include "config/issue_reporter.h"
#include "meridian/job.pb.h"

namespace meridian::config_internal {

void ValidateSites(const pb::JobConfig& config, const IssueReporter& root);

void ValidateModel(const pb::ModelConfig& model, const IssueReporter& r);
void ValidateData(const pb::DataConfig& data, int num_sites,
                  const IssueReporter& r);
void ValidateOptimizer(const pb::OptimizerConfig& optimizer,
                       const IssueReporter& r);
void ValidateServer(const pb::ServerConfig& server, const IssueReporter& r);
void ValidatePolicy(const pb::PolicyConfig& policy, const IssueReporter& r);

// `r` is at wan; `root` at the job (for issues of other sections the WAN
// settings make wrong).
void ValidateWan(const pb::JobConfig& config, const IssueReporter& r,
                 const IssueReporter& root);
void ValidateFault(const pb::FaultConfig& fault, const IssueReporter& r);

void ValidateSync(const pb::JobConfig& config, const IssueReporter& r);

void ValidateSecurity(const pb::JobConfig& config, const IssueReporter& root);

void ValidatePrograms(const pb::JobConfig& config, const IssueReporter& root);

}  // namespace meridian::config_internal

#endif  // MERIDIAN_CONFIG_VALIDATE_H_
