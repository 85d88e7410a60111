#include "testing/scripted_worker.h"

#include <random>
#include <thread>

#include "meridian/net/message.h"
#include "meridian/net/transport.h"

namespace meridian::testing {

Status RunScriptedWorker(zmq::context_t& context, const std::string& endpoint,
                         const std::string& site, const ModelLayout& layout,
                         int commits, uint64_t seed, std::vector<double>* sum,
                         std::chrono::milliseconds timeout,
                         std::chrono::milliseconds interval) {
  pb::Endpoint self;
  self.set_site(site);
  self.set_role(pb::ROLE_WORKER);
  self.set_id(0);
  RpcClient client(context, endpoint, self);
  pb::Header hello;
  hello.set_type(pb::HELLO);
  hello.mutable_hello()->set_worker_index(0);
  LayoutToSpecs(layout, hello.mutable_hello()->mutable_layout());
  MERIDIAN_ASSIGN_OR_RETURN(Envelope reply, client.Call(hello, {}, timeout));
  if (reply.header.type() != pb::WELCOME) {
    return InternalError("no WELCOME: " + DescribeHeader(reply.header));
  }
  uint64_t version = reply.header.welcome().model_version();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  sum->assign(layout.num_elements(), 0.0);
  for (int c = 0; c < commits; ++c) {
    pb::Header commit;
    commit.set_type(pb::COMMIT);
    AddLayoutSlices(layout, &commit);
    commit.mutable_commit()->set_base_version(version);
    commit.mutable_commit()->set_local_steps(1);
    std::vector<zmq::message_t> frames;
    for (const TensorInfo& tensor : layout.tensors()) {
      std::vector<float> values(tensor.size);
      for (uint64_t k = 0; k < tensor.size; ++k) {
        // Sparse-ish: most elements do not change in a given commit.
        values[k] = (rng() % 4 == 0) ? normal(rng) : 0.0f;
        (*sum)[tensor.offset + k] += values[k];
      }
      frames.push_back(CopyFloatFrame(values));
    }
    MERIDIAN_ASSIGN_OR_RETURN(reply,
                              client.Call(commit, std::move(frames), timeout));
    if (reply.header.type() != pb::MODEL) {
      return InternalError("commit refused: " + DescribeHeader(reply.header) +
                           " " + reply.header.error().message());
    }
    version = reply.header.model().version();
    if (interval.count() > 0) std::this_thread::sleep_for(interval);
  }
  pb::Header bye;
  bye.set_type(pb::BYE);
  bye.mutable_bye();
  return client.Call(bye, {}, timeout).status();
}

}  // namespace meridian::testing
