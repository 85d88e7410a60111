// Hand-made peer-site messages for tests of a site's mirror socket.
#ifndef MERIDIAN_TESTS_TESTING_MIRROR_MESSAGES_H_
#define MERIDIAN_TESTS_TESTING_MIRROR_MESSAGES_H_

#include <cstdint>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "meridian/layout.h"
#include "meridian/wire.pb.h"
#include "meridian/status.h"

namespace meridian::testing {

// Makes `header` a MIRROR_UPDATE of `clock` from `origin` that adds `value`
// to the first 3 elements of the layout's "fc0.bias" (fp32 through the
// compression pipeline) and appends its payload frame to `frames`. The
// sender and sequence are the caller's.
Status MakeBiasUpdate(const ModelLayout& layout, int64_t clock,
                      const std::string& origin, float value,
                      pb::Header* header, std::vector<zmq::message_t>* frames);

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTS_TESTING_MIRROR_MESSAGES_H_
