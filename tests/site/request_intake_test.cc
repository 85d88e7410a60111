#include "site/request_intake.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>
#include <zmq.hpp>

namespace meridian {
namespace {

Envelope Message(const std::string& connection, uint64_t sequence,
                 size_t payload_bytes = 0) {
  Envelope message;
  message.routing_id = connection;
  message.header.set_sequence(sequence);
  if (payload_bytes > 0) message.payload.emplace_back(payload_bytes);
  return message;
}

TEST(RequestIntakeTest, JoinedConnectionsGoFirstUnlessTheyHaveMessagesWaiting) {
  RequestIntake intake;
  EXPECT_TRUE(intake.ServeFirst("worker", /*joined=*/true));
  EXPECT_FALSE(intake.ServeFirst("stranger", /*joined=*/false));
  // A HELLO waits; the connection joins while it waits: its next message
  // still waits behind it.
  EXPECT_FALSE(intake.Wait(Message("joiner", 1)));
  EXPECT_FALSE(intake.ServeFirst("joiner", /*joined=*/true));
  EXPECT_FALSE(intake.Wait(Message("joiner", 2)));
  EXPECT_FALSE(intake.Wait(Message("stranger", 7)));
  std::optional<Envelope> next = intake.Next();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->header.sequence(), 1u);
  EXPECT_FALSE(intake.ServeFirst("joiner", /*joined=*/true));
  next = intake.Next();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->header.sequence(), 2u);
  EXPECT_TRUE(intake.ServeFirst("joiner", /*joined=*/true));
  next = intake.Next();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->routing_id, "stranger");
  EXPECT_FALSE(intake.Next());
  EXPECT_EQ(intake.waiting(), 0u);
}

TEST(RequestIntakeTest, MessagesBeyondTheCountBoundAreGivenBack) {
  RequestIntake intake;
  for (size_t i = 0; i < RequestIntake::kMaxWaitingMessages; ++i) {
    ASSERT_FALSE(intake.Wait(Message("c" + std::to_string(i % 7), i)));
  }
  std::optional<Envelope> refused = intake.Wait(Message("late", 999));
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->routing_id, "late");
  EXPECT_EQ(refused->header.sequence(), 999u);
  // One taken out makes room for one.
  ASSERT_TRUE(intake.Next());
  EXPECT_FALSE(intake.Wait(Message("late", 1000)));
}

TEST(RequestIntakeTest, PayloadBeyondTheByteBoundIsGivenBack) {
  RequestIntake intake;
  const size_t big = RequestIntake::kMaxWaitingBytes / 2;
  EXPECT_FALSE(intake.Wait(Message("a", 1, big)));
  EXPECT_FALSE(intake.Wait(Message("b", 2, big)));
  EXPECT_EQ(intake.waiting_bytes(), 2 * big);
  EXPECT_TRUE(intake.Wait(Message("c", 3, 1)));
  EXPECT_FALSE(intake.Wait(Message("c", 4)));  // no payload still fits
  ASSERT_TRUE(intake.Next());
  EXPECT_EQ(intake.waiting_bytes(), big);
  EXPECT_FALSE(intake.Wait(Message("c", 5, 1)));
}

}  // namespace
}  // namespace meridian
