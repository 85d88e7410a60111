#!/usr/bin/env bash
# The "Running the roles yourself" path of docs/guide.md, end to end: keys and job file
# from deploy/standalone/setup, then each role started alone, in the wrong
# order on purpose (sites first, the emulator last), with CURVE on. Checks
# that every site finishes with a summary, that updates crossed the WAN
# through the standalone wanem, and that the roles waited for each other
# instead of failing.
#
#   tests/deploy/standalone_test.sh MERIDIAN_BINARY
set -euo pipefail

binary="$1"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
dir="$(mktemp -d /tmp/meridian-standalone-XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [[ "${keep:-0}" != 1 ]]; then rm -rf "$dir"; fi
}
trap cleanup EXIT
fail() {
  keep=1
  echo "FAIL: $*" >&2
  for log in "$dir"/*.out; do echo "--- $log"; tail -n 15 "$log"; done >&2
  echo "(files kept in $dir)" >&2
  exit 1
}
# wait_for SECONDS TEXT FILE...: waits until every FILE contains TEXT.
wait_for() {
  local seconds=$1 text=$2 file
  shift 2
  local deadline=$((SECONDS + seconds))
  for file in "$@"; do
    until grep -qF "$text" "$file" 2>/dev/null; do
      ((SECONDS < deadline)) || fail "no '$text' in $file within $seconds s"
      sleep 0.1
    done
  done
}

"$repo/deploy/standalone/setup" "$dir/run" --budget 15 --binary "$binary" \
  > "$dir/setup.out"
job="$dir/run/job.pbtxt"
grep -q 'curve_public_key' "$job" || fail "setup wrote no public keys"
[[ "$(stat -c %a "$dir/run/keys/us.key")" == 600 ]] ||
  fail "secret key is not mode 0600"

# Site ap the long way: its workers first (they wait for their server),
# then the server. us and eu: one command each.
for index in 0 1 2 3; do
  "$binary" worker --config "$job" --site ap --index "$index" \
    > "$dir/worker-ap-$index.out" 2>&1 &
  pids+=($!)
done
wait_for 60 "waiting for site server 'ap'" "$dir"/worker-ap-{0,1,2,3}.out
site_pids=()
for site in ap eu us; do
  with_workers=(--with-workers)
  [[ "$site" == ap ]] && with_workers=()
  "$binary" site --config "$job" --site "$site" "${with_workers[@]}" \
    --out "$dir/run" > "$dir/site-$site.out" 2>&1 &
  pids+=($!)
  site_pids+=($!)
done
# Sites train and queue updates while the emulator is not up yet.
wait_for 120 'waiting for peer sites' "$dir"/site-{ap,eu,us}.out
"$binary" wanem --config "$job" --traffic-csv "$dir/run/traffic.csv" \
  > "$dir/wanem.out" 2>&1 &
wanem_pid=$!
pids+=($wanem_pid)

deadline=$((SECONDS + 240))
for pid in "${site_pids[@]}"; do
  while kill -0 "$pid" 2>/dev/null; do
    (( SECONDS < deadline )) || fail "sites did not finish within 240 s"
    sleep 1
  done
  wait "$pid" || fail "a site server exited with status $?"
done
kill "$wanem_pid"
wait "$wanem_pid" || true

for site in us eu ap; do
  summary="$dir/run/site-$site.json"
  [[ -s "$summary" ]] || fail "site $site wrote no summary"
  grep -q '"final_accuracy"' "$summary" || fail "site $site: no final accuracy"
  grep -q 'CURVE on' "$dir/site-$site.out" ||
    fail "site $site did not say its links are encrypted"
done
grep -q "waiting for site server 'ap'" "$dir/worker-ap-0.out" ||
  fail "worker ap/0 did not say it was waiting for its server"
grep -q 'waiting for peer sites' "$dir"/site-*.out ||
  fail "no site said it was waiting for its peers"
grep -q '6 routes' "$dir/wanem.out" || fail "wanem did not open the 6 routes"
# Bytes crossed every link direction of the emulator.
awk -F, 'NR > 1 && $0 !~ /^#/ { bytes[$2 "," $3] = $5 }
         END { n = 0; for (k in bytes) if (bytes[k] > 0) n++; exit n < 6 }' \
  "$dir/run/traffic.csv" || fail "traffic.csv shows a link direction without bytes"
echo "PASS: 3 sites, CURVE on, through a standalone wanem"
