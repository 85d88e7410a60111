// Which connection the metrics endpoint closes to admit a new one
// (src/metrics/connection_budget.h).
#include "metrics/connection_budget.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>

namespace meridian {
namespace {

using Time = ConnectionBudget::Time;
using std::chrono::seconds;

PeerAddress Peer(const std::string& ip) {
  sockaddr_storage storage{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  v4->sin_family = AF_INET;
  ::inet_pton(AF_INET, ip.c_str(), &v4->sin_addr);
  return PeerAddress::FromSockaddr(storage);
}

const Time kT0 = Time() + seconds(1000);

TEST(PeerAddressTest, IPv4AndItsMappedFormAreOnePeer) {
  sockaddr_storage storage{};
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  v6->sin6_family = AF_INET6;
  ::inet_pton(AF_INET6, "::ffff:10.1.2.3", &v6->sin6_addr);
  EXPECT_EQ(PeerAddress::FromSockaddr(storage), Peer("10.1.2.3"));
  EXPECT_EQ(Peer("10.1.2.3").ToString(), "10.1.2.3");
  ::inet_pton(AF_INET6, "2001:db8::1", &v6->sin6_addr);
  EXPECT_EQ(PeerAddress::FromSockaddr(storage).ToString(), "2001:db8::1");
}

TEST(ConnectionBudgetTest, AdmitsFreelyUnderTheCaps) {
  ConnectionBudget budget(4, 2);
  const ConnectionBudget::Admission admission = budget.Admit(Peer("10.0.0.1"));
  EXPECT_EQ(admission.cap, ConnectionBudget::Cap::kNone);
  EXPECT_FALSE(admission.shed.has_value());
}

TEST(ConnectionBudgetTest, AtItsCapAnAddressPushesOutItsOwnLongestWaiting) {
  ConnectionBudget budget(100, 3);
  const PeerAddress a = Peer("10.0.0.1");
  const PeerAddress b = Peer("10.0.0.2");
  budget.Add(1, a, kT0);
  budget.Add(2, b, kT0);  // older than a's next ones, another address
  budget.Add(3, a, kT0 + seconds(1));
  budget.Add(4, a, kT0 + seconds(2));
  ConnectionBudget::Admission admission = budget.Admit(a);
  EXPECT_EQ(admission.cap, ConnectionBudget::Cap::kPerAddress);
  EXPECT_EQ(admission.shed, 1u);
  // A kept-alive connection that began waiting again later goes after.
  budget.MarkIdle(1, kT0 + seconds(5));
  EXPECT_EQ(budget.Admit(a).shed, 3u);
  // b is under its cap.
  EXPECT_FALSE(budget.Admit(b).shed.has_value());
}

TEST(ConnectionBudgetTest, IdleConnectionsGoBeforeOnesBeingAnswered) {
  ConnectionBudget budget(100, 2);
  const PeerAddress a = Peer("10.0.0.1");
  budget.Add(1, a, kT0);
  budget.Add(2, a, kT0 + seconds(1));
  budget.MarkBusy(1, kT0 + seconds(1));  // its client reads slowly
  EXPECT_EQ(budget.Admit(a).shed, 2u);
  budget.MarkBusy(2, kT0 + seconds(2));
  EXPECT_EQ(budget.Admit(a).shed, 1u);  // all busy: the longest waiting
}

TEST(ConnectionBudgetTest, AtTheTotalCapTheHeaviestAddressPays) {
  ConnectionBudget budget(5, 10);
  const PeerAddress light = Peer("10.0.0.1");
  const PeerAddress heavy = Peer("10.0.0.2");
  budget.Add(1, light, kT0);  // the oldest of all
  budget.Add(2, heavy, kT0 + seconds(1));
  budget.Add(3, heavy, kT0 + seconds(2));
  budget.Add(4, heavy, kT0 + seconds(3));
  budget.Add(5, light, kT0 + seconds(4));
  for (const PeerAddress& newcomer : {light, heavy, Peer("10.0.0.3")}) {
    const ConnectionBudget::Admission admission = budget.Admit(newcomer);
    EXPECT_EQ(admission.cap, ConnectionBudget::Cap::kTotal);
    EXPECT_EQ(admission.shed, 2u);
  }
  budget.Remove(2);
  budget.Add(6, Peer("10.0.0.3"), kT0 + seconds(5));
  EXPECT_EQ(budget.size(), 5u);
  EXPECT_EQ(budget.CountOf(heavy), 2u);
  // light and heavy hold 2 each: the oldest of either.
  const std::optional<uint64_t> shed = budget.Admit(light).shed;
  EXPECT_TRUE(shed == 1u || shed == 3u) << shed.value_or(0);
}

TEST(ConnectionBudgetTest, RemoveForgetsTheConnection) {
  ConnectionBudget budget(1, 1);
  const PeerAddress a = Peer("10.0.0.1");
  budget.Add(7, a, kT0);
  budget.Remove(7);
  budget.Remove(7);  // twice: nothing
  EXPECT_EQ(budget.size(), 0u);
  EXPECT_EQ(budget.CountOf(a), 0u);
  EXPECT_FALSE(budget.Admit(a).shed.has_value());
}

}  // namespace
}  // namespace meridian
