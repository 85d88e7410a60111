// A worker driven by a test over a real RpcClient, for tests that need
// known updates at a live site server (sync conservation, CURVE sync).
#ifndef MERIDIAN_TESTS_TESTING_SCRIPTED_WORKER_H_
#define MERIDIAN_TESTS_TESTING_SCRIPTED_WORKER_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "meridian/core/layout.h"
#include "meridian/core/status.h"

namespace meridian::testing {

// Joins the server at `endpoint` as worker 0 of `site`, commits `commits`
// sparse pseudo-random updates (normal(0, 0.01) on about a quarter of the
// elements, drawn from `seed`), adding each element's total to `*sum`
// (resized to the model), and leaves. Every reply must come within
// `timeout`; a refused commit is an error naming the refusal.
// `interval`: a pause after each commit (spreads the commits over time).
Status RunScriptedWorker(
    zmq::context_t& context, const std::string& endpoint,
    const std::string& site, const ModelLayout& layout, int commits,
    uint64_t seed, std::vector<double>* sum, std::chrono::milliseconds timeout,
    std::chrono::milliseconds interval = std::chrono::milliseconds(0));

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTS_TESTING_SCRIPTED_WORKER_H_
