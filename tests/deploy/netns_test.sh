#!/usr/bin/env bash
# Integration test of deploy/netns/meridian-netns: a small three-site job
# (deploy/netns/three-regions-netns.pbtxt with a 20 s budget and 2 workers
# per site) in network namespaces, every cross-site byte through wanem in
# the router namespace. Checks that every site trained and synced, that
# wanem carried traffic on every link, and that nothing is left behind: no
# namespace, no process. Then interrupts a second run half-way and checks
# the same clean-up.
#
#   tests/deploy/netns_test.sh MERIDIAN_BINARY
#
# Exit 77 (ctest SKIP_RETURN_CODE), saying why, where the machine cannot run
# it: not root, no iproute2, no network namespaces, or no Fashion-MNIST.
set -euo pipefail

bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
source_dir="$(cd "$here/../.." && pwd)"
script="$source_dir/deploy/netns/meridian-netns"
data=/usr/share/datasets/fashion-mnist

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

# --- can this machine? --------------------------------------------------------
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (uid $(id -u))"
command -v ip >/dev/null || skip "needs iproute2 ('ip' not found)"
probe="mdprobe$$"
if ! error="$(ip netns add "$probe" 2>&1)"; then
  skip "cannot create a network namespace: $error"
fi
ip netns del "$probe"
[ -r "$data/train-images-idx3-ubyte.gz" ] ||
  skip "no Fashion-MNIST in $data (Debian package dataset-fashion-mnist)"
[ -x "$bin" ] || fail "no meridian binary at $bin"

# --- set-up and unconditional clean-up ---------------------------------------
export MERIDIAN="$bin"
export MERIDIAN_NETNS_PREFIX="mdt$$"
tmp="$(mktemp -d /tmp/meridian-netns-test.XXXXXX)"
cleanup() {
  # Whatever happened: end what runs in our namespaces, delete them.
  "$script" down >/dev/null 2>&1 || true
  [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

our_namespaces() { ip netns list | awk '{print $1}' | grep -E "^${MERIDIAN_NETNS_PREFIX}-" || true; }
# Processes running our job file (pgrep is not everywhere; /proc is).
our_processes() {
  local pid
  for pid in /proc/[0-9]*; do
    { tr '\0' ' ' <"$pid/cmdline"; } 2>/dev/null | grep -q -- "$tmp/job.pbtxt" &&
      echo "${pid#/proc/}"
  done
  return 0
}
assert_clean() {
  local left
  left="$(our_namespaces)"
  [ -z "$left" ] || fail "$1: namespaces left behind: $left"
  left="$(our_processes)"
  [ -z "$left" ] || fail "$1: processes left behind: $left"
  # veths only ever exist inside the namespaces; none in the host's.
  if ip -o link show | grep -q -E ': (uplink|site[0-9]+)@'; then
    fail "$1: veth left in the host namespace"
  fi
}

sed -e 's/^time_budget_s: .*/time_budget_s: 20/' \
    -e 's/workers { count: 4 }/workers { count: 2 }/' \
    "$source_dir/deploy/netns/three-regions-netns.pbtxt" >"$tmp/job.pbtxt"
grep -q '^time_budget_s: 20$' "$tmp/job.pbtxt" || fail "could not shorten the budget"
[ "$(grep -c 'workers { count: 2 }' "$tmp/job.pbtxt")" -eq 3 ] ||
  fail "could not set 2 workers per site"
"$bin" validate "$tmp/job.pbtxt"

# --- a whole run ---------------------------------------------------------------
start=$SECONDS
status=0
"$script" run "$tmp/job.pbtxt" "$tmp/out" --timeout 150 || status=$?
echo "meridian-netns run: exit $status after $((SECONDS - start)) s"
if [ "$status" -ne 0 ]; then
  for log in "$tmp"/out/logs/*.log; do
    echo "--- $log"; tail -n 15 "$log"
  done
  fail "meridian-netns run exited with $status"
fi
assert_clean "after the run"

python3 - "$tmp/out" <<'EOF'
import csv, json, os, sys
out = sys.argv[1]
failed = []
for site in ("us", "eu", "ap"):
    with open(os.path.join(out, f"site-{site}.json")) as f:
        s = json.load(f)
    sync = s.get("sync", {})
    print(f"site {site}: accuracy {s['final_accuracy']:.4f}, "
          f"{s['commits']} commits, clock {sync.get('clock')}, "
          f"{sync.get('bytes_sent', 0) / 1e6:.2f} MB sent, "
          f"{sync.get('updates_received', 0):.0f} updates received, "
          f"flushed {sync.get('flushed')}")
    # 20 s of an MLP on Fashion-MNIST is far above chance (0.1).
    if s["final_accuracy"] < 0.5:
        failed.append(f"{site}: accuracy {s['final_accuracy']}")
    if s["commits"] <= 0:
        failed.append(f"{site}: no commits")
    if sync.get("updates_received", 0) <= 0:
        failed.append(f"{site}: received no update from its peers")
    if not sync.get("flushed"):
        failed.append(f"{site}: final flush incomplete")
# Every link carried bytes through wanem in the router namespace.
last = {}
with open(os.path.join(out, "traffic.csv")) as f:
    for row in csv.DictReader(f):
        key = (row["from_site"], row["to_site"])
        last[key] = max(last.get(key, 0), float(row["bytes"]))
for a in ("us", "eu", "ap"):
    for b in ("us", "eu", "ap"):
        if a != b:
            print(f"wanem {a}->{b}: {last.get((a, b), 0) / 1e6:.2f} MB")
            if last.get((a, b), 0) <= 0:
                failed.append(f"no bytes {a}->{b} through wanem")
if failed:
    sys.exit("FAIL: " + "; ".join(failed))
EOF

# --- an interrupted run cleans up too (and tbf shapes the uplinks) ---------------
"$script" run "$tmp/job.pbtxt" "$tmp/out2" --timeout 150 --rate 200mbit \
  >"$tmp/run2.log" 2>&1 &
run_pid=$!
# Half-way: once site ap trains.
deadline=$((SECONDS + 120))
until grep -q 'workers joined; training' "$tmp/out2/logs/site-ap.log" 2>/dev/null; do
  [ "$SECONDS" -lt "$deadline" ] || fail "site ap of the second run did not train within 120 s: $(tail -n 5 "$tmp/run2.log")"
  kill -0 "$run_pid" 2>/dev/null || fail "the second run ended early: $(tail -n 5 "$tmp/run2.log")"
  sleep 0.2
done
[ -n "$(our_namespaces)" ] || fail "the second run made no namespaces: $(cat "$tmp/run2.log")"
qdisc="$(ip netns exec "$MERIDIAN_NETNS_PREFIX-us" tc qdisc show dev uplink)"
echo "$qdisc" | grep -q 'tbf.*rate 200Mbit' || fail "no tbf on us's uplink: $qdisc"
kill -TERM "$run_pid"
status=0
wait "$run_pid" || status=$?
[ "$status" -eq 130 ] || fail "interrupted run exited $status, expected 130: $(tail -n 5 "$tmp/run2.log")"
assert_clean "after an interrupted run"
echo "interrupted run (tbf 200mbit on every uplink): exit 130, namespaces and processes gone"
echo "PASS"
