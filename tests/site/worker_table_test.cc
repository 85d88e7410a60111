// The site server's worker table on virtual time (seconds passed in):
// membership by incarnation, liveness, stalls, sequence numbers and commit
// ids.
#include "site/worker_table.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace meridian {
namespace {

using Kind = Admission::Kind;

constexpr double kTimeout = 10;

WorkerTable MakeTable(uint32_t workers) {
  std::vector<WorkerSlot> slots(workers);
  for (uint32_t i = 0; i < workers; ++i) {
    slots[i].site = "a";
    slots[i].index = i;
  }
  return WorkerTable(std::move(slots), "a", kTimeout);
}

pb::Header Request(pb::MessageType type, uint32_t worker, uint64_t sequence) {
  pb::Header header;
  header.set_type(type);
  header.mutable_sender()->set_site("a");
  header.mutable_sender()->set_role(pb::ROLE_WORKER);
  header.mutable_sender()->set_id(worker);
  header.set_sequence(sequence);
  return header;
}

// Admits `worker` and answers its HELLO, as the server does at the start.
void Join(WorkerTable* table, uint32_t worker, uint64_t incarnation,
          const std::string& connection, double now_s) {
  const Admission admission =
      table->Admit(worker, incarnation, connection, 1, now_s);
  ASSERT_NE(admission.kind, Kind::kRefused) << admission.refusal.reason;
  table->NoteAnswered(worker, now_s);
}

TEST(WorkerTableTest, RequestsComeFromTheJoinedConnectionInSequence) {
  WorkerTable table = MakeTable(2);
  EXPECT_EQ(table.Admit(0, 7, "c0", 1, 0).kind, Kind::kJoined);
  EXPECT_EQ(table[0].pending, Pending::kHello);
  EXPECT_EQ(table.LiveCount(), 1u);
  EXPECT_EQ(table.DescribeNotLive(), "a/1");
  // Not answered yet: a request before the WELCOME is refused.
  WorkerTable::Checked early =
      table.CheckRequest(Request(pb::COMMIT, 0, 2), "c0", 1);
  EXPECT_FALSE(early.slot);
  EXPECT_EQ(early.refusal.code, pb::ERROR_UNEXPECTED);
  table.NoteAnswered(0, 1);

  EXPECT_EQ(table.CheckRequest(Request(pb::COMMIT, 0, 2), "c0", 1).slot, 0u);
  table.NoteAnswered(0, 1);
  // Replayed sequence, another connection, an unknown worker, a slot that
  // never joined.
  EXPECT_EQ(table.CheckRequest(Request(pb::COMMIT, 0, 2), "c0", 1).refusal.code,
            pb::ERROR_STALE);
  EXPECT_EQ(
      table.CheckRequest(Request(pb::COMMIT, 0, 3), "other", 1).refusal.code,
      pb::ERROR_UNKNOWN_SENDER);
  EXPECT_EQ(table.CheckRequest(Request(pb::COMMIT, 5, 3), "c0", 1).refusal.code,
            pb::ERROR_UNKNOWN_SENDER);
  EXPECT_EQ(table.CheckRequest(Request(pb::PULL, 1, 3), "c1", 1).refusal.code,
            pb::ERROR_UNKNOWN_SENDER);
  // A BYE may come while a request is pending.
  EXPECT_TRUE(table.CheckRequest(Request(pb::PULL, 0, 3), "c0", 1).slot);
  EXPECT_TRUE(table.CheckRequest(Request(pb::BYE, 0, 4), "c0", 1, true).slot);
  table.Leave(0);
  EXPECT_EQ(table.Count(SlotState::kLeft), 1u);
  EXPECT_EQ(table.CheckRequest(Request(pb::PULL, 0, 5), "c0", 1).refusal.code,
            pb::ERROR_UNEXPECTED);
}

TEST(WorkerTableTest, SilentWorkersAreDeclaredDeadAndHeartbeatsKeepThemLive) {
  WorkerTable table = MakeTable(2);
  Join(&table, 0, 1, "c0", 0);
  Join(&table, 1, 2, "c1", 0);
  double stalled = -1;
  for (double t = 0; t <= 20; t += 0.5) {
    // Worker 0 heartbeats; worker 1 heartbeats over a connection that is
    // not its own (a leftover of an old one), which does not count.
    table.OnHeartbeat(Request(pb::HEARTBEAT, 0, 0), "c0", t);
    table.OnHeartbeat(Request(pb::HEARTBEAT, 1, 0), "old", t);
    // Worker 1 waits for an answer when it goes silent.
    if (t == 3) {
      ASSERT_TRUE(table.CheckRequest(Request(pb::COMMIT, 1, 2), "c1", t).slot);
      table[1].pending = Pending::kCommit;
    }
    const std::vector<WorkerTable::Death> dead =
        table.CheckLiveness(t, &stalled);
    EXPECT_EQ(stalled, 0);
    if (t <= 13) {
      EXPECT_TRUE(dead.empty()) << "t = " << t;
    } else if (t == 13.5) {
      ASSERT_EQ(dead.size(), 1u);
      EXPECT_EQ(dead[0].slot, 1u);
      EXPECT_EQ(dead[0].dropped, Pending::kCommit);
      EXPECT_DOUBLE_EQ(dead[0].silent_s, 10.5);
    } else {
      EXPECT_TRUE(dead.empty()) << "declared twice at t = " << t;
    }
  }
  EXPECT_EQ(table[0].state, SlotState::kLive);
  EXPECT_EQ(table[1].state, SlotState::kDead);
  EXPECT_EQ(table[1].pending, Pending::kNone);
  // A dead worker's requests are refused until it joins again.
  WorkerTable::Checked refused =
      table.CheckRequest(Request(pb::COMMIT, 1, 3), "c1", 21);
  EXPECT_FALSE(refused.slot);
  EXPECT_EQ(refused.refusal.code, pb::ERROR_UNKNOWN_SENDER);
}

TEST(WorkerTableTest, OwnStallGivesEveryWorkerAFreshWindow) {
  WorkerTable table = MakeTable(2);
  Join(&table, 0, 1, "c0", 0);
  Join(&table, 1, 2, "c1", 0);
  double stalled = 0;
  EXPECT_TRUE(table.CheckLiveness(1, &stalled).empty());
  // The loop did not run for 30 s (the process was stopped): nobody is
  // declared dead for it, and everybody gets the whole timeout again.
  EXPECT_TRUE(table.CheckLiveness(31, &stalled).empty());
  EXPECT_DOUBLE_EQ(stalled, 30);
  EXPECT_TRUE(table.CheckLiveness(31.5, &stalled).empty());
  EXPECT_EQ(stalled, 0);
  std::vector<WorkerTable::Death> dead;
  for (double t = 32; t <= 42 && dead.empty(); t += 0.5) {
    dead = table.CheckLiveness(t, &stalled);
  }
  EXPECT_EQ(dead.size(), 2u);
}

TEST(WorkerTableTest, IncarnationsDecideBetweenReconnectRejoinAndRestart) {
  WorkerTable table = MakeTable(1);
  Join(&table, 0, 100, "c0", 0);
  table[0].stats.set_steps(50);
  table[0].stats.set_commits(5);
  ASSERT_TRUE(table.CheckRequest(Request(pb::COMMIT, 0, 2), "c0", 1).slot);
  table[0].pending = Pending::kCommit;
  table.RecordApplied(0, 1);

  // The same process over a new connection while its commit is held: the
  // commit's answer goes there, as a WELCOME.
  Admission a = table.Admit(0, 100, "c1", 9, 2);
  EXPECT_EQ(a.kind, Kind::kReconnected);
  EXPECT_TRUE(a.request_pending);
  EXPECT_EQ(table[0].pending, Pending::kHello);
  EXPECT_EQ(table[0].routing_id, "c1");
  EXPECT_EQ(table[0].last_commit_id, 1u);
  EXPECT_EQ(table[0].incarnations, 1u);
  table.NoteAnswered(0, 2);
  // Its sequence numbers went on from the HELLO's.
  EXPECT_TRUE(table.CheckRequest(Request(pb::PULL, 0, 10), "c1", 2).slot);
  table.NoteAnswered(0, 2);

  // Declared dead (silent since 2), then back as the same process.
  double stalled = 0;
  for (double t = 2.5; t <= 12.5; t += 0.5) table.CheckLiveness(t, &stalled);
  ASSERT_EQ(table[0].state, SlotState::kDead);
  a = table.Admit(0, 100, "c2", 20, 15.5);
  EXPECT_EQ(a.kind, Kind::kRejoined);
  EXPECT_NEAR(a.dead_s, 3, 1e-9);
  EXPECT_EQ(table[0].last_commit_id, 1u);
  table.NoteAnswered(0, 15.5);

  // A restarted process takes the slot: its request (none) dropped, its
  // commit ids start again, its predecessor's statistics are kept.
  a = table.Admit(0, 200, "c3", 1, 16);
  EXPECT_EQ(a.kind, Kind::kRestarted);
  EXPECT_EQ(a.previous, SlotState::kLive);
  EXPECT_EQ(table[0].last_commit_id, 0u);
  EXPECT_EQ(table[0].incarnations, 2u);
  EXPECT_EQ(table[0].commits_applied, 1u);
  table[0].stats.set_steps(7);
  EXPECT_EQ(WorkerTable::TotalStats(table[0]).steps(), 57u);
  EXPECT_EQ(WorkerTable::TotalStats(table[0]).commits(), 5u);
  // The replaced process may not come back.
  a = table.Admit(0, 100, "c4", 30, 17);
  EXPECT_EQ(a.kind, Kind::kRefused);
  EXPECT_EQ(a.refusal.code, pb::ERROR_UNEXPECTED);
  EXPECT_EQ(table[0].routing_id, "c3");
}

TEST(WorkerTableTest, RetiredIncarnationsAreBounded) {
  WorkerTable table = MakeTable(1);
  for (uint64_t incarnation = 1; incarnation <= 20; ++incarnation) {
    ASSERT_NE(table.Admit(0, incarnation, "c", 1, 0).kind, Kind::kRefused);
  }
  EXPECT_EQ(table[0].retired.size(), WorkerTable::kMaxRetiredIncarnations);
  EXPECT_EQ(table[0].incarnations, 20u);
}

TEST(WorkerTableTest, ClientsWithoutIncarnationCannotTakeALiveSlot) {
  WorkerTable table = MakeTable(1);
  Join(&table, 0, 0, "c0", 0);
  Admission a = table.Admit(0, 0, "c1", 1, 1);
  EXPECT_EQ(a.kind, Kind::kRefused);
  EXPECT_NE(a.refusal.reason.find("already joined"), std::string::npos);
  // Not the live slot of a worker that has one either.
  WorkerTable other = MakeTable(1);
  Join(&other, 0, 7, "c0", 0);
  EXPECT_EQ(other.Admit(0, 0, "c1", 1, 1).kind, Kind::kRefused);
  EXPECT_EQ(other[0].incarnation, 7u);
  EXPECT_EQ(other[0].routing_id, "c0");
  // ... nor come back after BYE; a process with an incarnation may.
  table.Leave(0);
  EXPECT_EQ(table.Admit(0, 0, "c1", 1, 1).kind, Kind::kRefused);
  EXPECT_EQ(table.Admit(0, 9, "c1", 1, 1).kind, Kind::kRestarted);
}

TEST(WorkerTableTest, CommitIdsApplyOnce) {
  WorkerTable table = MakeTable(1);
  Join(&table, 0, 5, "c0", 0);
  EXPECT_FALSE(table.IsDuplicate(0, 1));
  table.RecordApplied(0, 1);
  table.RecordApplied(0, 3);  // 2 was refused: ids may skip
  EXPECT_TRUE(table.IsDuplicate(0, 1));
  EXPECT_TRUE(table.IsDuplicate(0, 2));
  EXPECT_TRUE(table.IsDuplicate(0, 3));
  EXPECT_FALSE(table.IsDuplicate(0, 4));
  // Clients without ids are never duplicates.
  EXPECT_FALSE(table.IsDuplicate(0, 0));
  table.RecordDuplicate(0);
  EXPECT_EQ(table.duplicate_commits(), 1u);
  EXPECT_EQ(table[0].commits_applied, 2u);

  // What a checkpoint keeps brings the same process back into a fresh
  // table knowing what was applied.
  WorkerTable restored = MakeTable(1);
  restored.RestoreCommitRecords(table.CommitRecords());
  Admission a = restored.Admit(0, 5, "c9", 1, 0);
  EXPECT_EQ(a.kind, Kind::kRejoined);
  EXPECT_EQ(restored[0].last_commit_id, 3u);
  EXPECT_TRUE(restored.IsDuplicate(0, 3));
}

TEST(WorkerTableTest, HeldWorkersAreDueHeartbeats) {
  WorkerTable table = MakeTable(3);
  Join(&table, 0, 1, "c0", 0);
  Join(&table, 1, 2, "c1", 0);
  table[1].pending = Pending::kCommit;  // held by a barrier
  EXPECT_TRUE(table.DueForHeartbeat(0.5, 1).empty());
  EXPECT_EQ(table.DueForHeartbeat(1, 1), (std::vector<uint32_t>{1}));
  table.NoteSent(1, 1);
  EXPECT_TRUE(table.DueForHeartbeat(1.5, 1).empty());
  EXPECT_EQ(table.DueForHeartbeat(2, 1), (std::vector<uint32_t>{1}));
}

}  // namespace
}  // namespace meridian
