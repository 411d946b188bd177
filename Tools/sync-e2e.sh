#!/usr/bin/env bash
# Ferry's end-to-end proof (DESIGN §6a): a notes client on Ferry (Tools/SyncE2E, notes-client)
# against a real HTTP server on 127.0.0.1 that keeps its own record of every request
# (notes-server), with the network cut for a minute, the client killed mid-request, the server
# failing, refusing and restarting, and two client processes on one store. The verdict is read
# off the server's record against the changes this script asked for (Tools/SyncE2E/check.py):
#
#   sync e2e: N changes, K kills, O outages, L lost, D applied twice, R out of order, S stale reads after push
#
# Exit status: 0 when L, D, R and S are 0, K ≥ 20 and every scenario's own check held; 1 a build
# or setup failure; 2 the verdict failed; 3 the server died by a signal it was not sent; 4 a
# client died by a signal it was not sent; 5 a step did not finish in time or failed; 6 the
# offline scenario spent attempts or killed tasks.
#
# It runs twice: one request a change, then with the client's handlers batched 16 at a time
# (`POST /batch`, which stops a note's changes at its first not applied); each run prints its
# verdict line, led by its mode. FERRY_E2E_MODE=single or batch16 runs one mode only.
#
# FERRY_E2E_OFFLINE_SECONDS (default 60; 20 in the batch run) and FERRY_E2E_KILLS (default 24)
# shorten a local run.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${FERRY_E2E_MODE:-}" ]; then
  FERRY_E2E_MODE=single bash "$0" "$@"
  # The batch run's offline minute proves nothing the single run did not: a shorter one.
  FERRY_E2E_MODE=batch16 FERRY_E2E_OFFLINE_SECONDS=${FERRY_E2E_OFFLINE_SECONDS:-20} bash "$0" "$@"
  exit 0
fi
case "$FERRY_E2E_MODE" in
single) batch_flags=() ;;
batch16) batch_flags=(--batch 16) ;;
*)
  echo "e2e: FERRY_E2E_MODE=$FERRY_E2E_MODE: single or batch16" >&2
  exit 1
  ;;
esac
source Tools/setup.sh

package=Tools/SyncE2E
offline_seconds=${FERRY_E2E_OFFLINE_SECONDS:-60}
kill_target=${FERRY_E2E_KILLS:-24}

# Progress lines say "e2e:"; only the verdict's last line says "sync e2e:".
say() { echo "e2e ($FERRY_E2E_MODE): $*"; }
die() {
  echo "e2e: FAILED: $1" >&2
  exit "${2:-5}"
}

for tool in python3 curl timeout; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is needed and missing" 1
done

build_log=$(mktemp)
say "building $package (its own .build; the first build takes minutes)..."
build_status=0
swift build -c debug --package-path "$package" >"$build_log" 2>&1 || build_status=$?
if [ "$build_status" -ne 0 ] && grep -q "cannot find .* in scope" "$build_log"; then
  # A .build made before Ferry gained source files may plan without them: plan again.
  say "planning the build again (a stale build plan missed new files)..."
  rm -f "$package/.build/build.db" "$package"/.build/*.yaml
  build_status=0
  swift build -c debug --package-path "$package" >"$build_log" 2>&1 || build_status=$?
fi
if [ "$build_status" -ne 0 ]; then
  grep -E "error:" "$build_log" | head -n 40 >&2 || cat "$build_log" >&2
  rm -f "$build_log"
  die "the build of $package failed" 1
fi
own_warnings=$(grep -E "^$(pwd)/$package/Sources/.*warning:" "$build_log" | sort -u || true)
rm -f "$build_log"
if [ -n "$own_warnings" ]; then
  echo "$own_warnings" >&2
  die "the build of $package has warnings in its own code" 1
fi
bin=$(swift build -c debug --package-path "$package" --show-bin-path)

work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-sync-e2e.XXXXXX")
home=$work/app
net=$work/net
mkdir -p "$net" "$home"
: >"$work/asked.jsonl"
: >"$work/events.jsonl"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url="http://127.0.0.1:$port"
server_pid=""
started_at=$(date +%s)

cleanup() {
  local status=$?
  # Only this shell's jobs still running (never a pid already reaped, which may be reused).
  for pid in $(jobs -p); do
    kill -9 "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  if [ "$status" -eq 0 ]; then
    rm -rf "$work"
  else
    echo "e2e: the work directory is kept for a look: $work" >&2
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_ms() { date +%s%3N; }
event() { echo "$1" >>"$work/events.jsonl"; }

# The server's exit status, when it has exited: a death by a signal nobody sent is a failure.
check_server() {
  [ -n "$server_pid" ] || return 0
  if ! kill -0 "$server_pid" 2>/dev/null; then
    local status=0
    wait "$server_pid" || status=$?
    tail -n 20 "$work/server.log" >&2 || true
    if [ "$status" -ge 128 ]; then die "the server died by signal $((status - 128))" 3; fi
    die "the server exited (status $status)" 5
  fi
}

start_server() {
  local before
  before=$(grep -c "listening" "$work/server.log" 2>/dev/null || true)
  "$bin/notes-server" --port "$port" --dir "$work/server" "$@" >>"$work/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 200); do
    if [ "$(grep -c "listening" "$work/server.log" 2>/dev/null || true)" -gt "${before:-0}" ]; then return 0; fi
    check_server
    sleep 0.05
  done
  die "the server did not start within 10 s"
}

kill_server() {
  kill -9 "$server_pid"
  local status=0
  { wait "$server_pid" || status=$?; } 2>/dev/null
  [ "$status" -eq 137 ] || die "the server ended with status $status before it was killed"
  server_pid=""
}

control() {
  curl -sf -X POST "$url/control" -H 'Content-Type: application/json' -d "$1" >/dev/null ||
    die "the server's control endpoint refused $1"
}

# Runs the client in the foreground (at most 120 s), its stdout into $1.
client() {
  local out=$1
  shift
  local status=0
  timeout --kill-after=5 120 "$bin/notes-client" --home "$home" --server "$url" --net "$net" "${batch_flags[@]}" "$@" \
    >"$out" 2>>"$work/client.err" || status=$?
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then die "notes-client $* did not finish within 120 s"; fi
  if [ "$status" -ge 128 ]; then die "notes-client $* died by signal $((status - 128))" 4; fi
  return "$status"
}

# Starts `sync` in the background; its pid in $last_pid.
client_background() {
  local out=$1
  shift
  "$bin/notes-client" --home "$home" --server "$url" --net "$net" "${batch_flags[@]}" "$@" >"$out" 2>>"$work/client.err" &
  last_pid=$!
}

# Waits for a background client that nobody kills; it must exit 0.
wait_client() {
  local pid=$1 what=$2 status=0
  wait "$pid" || status=$?
  if [ "$status" -ge 128 ]; then die "$what died by signal $((status - 128))" 4; fi
  [ "$status" -eq 0 ] || die "$what exited with status $status: $(tail -n 3 "$work/client.err")"
}

sync_now() {
  client "$work/sync.json" sync --for "${1:-60}" ||
    die "sync did not empty the queue: $(cat "$work/sync.json") $(tail -n 3 "$work/client.err")"
}

changes_asked=0
ask() { # ask KIND LOCALID TITLE PHASE: queue a create or an edit, and note it as asked
  local kind=$1 id=$2 title=$3 phase=$4
  changes_asked=$((changes_asked + 1))
  local body="b-$id-$changes_asked"
  if [ "$kind" = create ]; then
    client "$work/ask.json" create "$id" "$title" "$body" || die "create $id failed"
  else
    client "$work/ask.json" edit "$id" "$title" "$body" || die "edit $id failed"
  fi
  printf '{"kind":"%s","localId":"%s","title":"%s","body":"%s","phase":"%s"}\n' \
    "$kind" "$id" "$title" "$body" "$phase" >>"$work/asked.jsonl"
}

reads=0
read_after_push() { # a read after a push that succeeded: it must show every change asked so far
  reads=$((reads + 1))
  local out="$work/read-$reads.json"
  client "$out" read || die "read failed: $(tail -n 3 "$work/client.err")"
  event "{\"event\":\"read\",\"file\":\"$out\",\"asked\":$changes_asked}"
  say "  read after push: refresh $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["refresh"])' "$out")"
}

json_field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

start_server
say "server on $url, record in $work/server"

# 1. Offline for a minute with changes queued (notes created and edited offline: their edits need
#    the server's id, which only the create's output will hold), then online.
say "[1/6] offline for ${offline_seconds} s with changes queued"
touch "$net/offline"
offline_started=$(date +%s)
for i in 1 2 3 4 5 6; do ask create "o$i" "offline note $i" offline; done
for i in 1 2 3 4 5 6; do ask edit "o$i" "offline note $i v1" offline; done
for i in 1 2 3; do ask edit "o$i" "offline note $i v2" offline; done
client_background "$work/sync-offline.json" sync --for $((offline_seconds + 60))
offline_sync=$last_pid
client "$work/read-offline.json" read || die "read while offline failed"
say "  read while offline: refresh $(json_field "$work/read-offline.json" refresh)"
while [ $(($(date +%s) - offline_started)) -lt "$offline_seconds" ]; do
  kill -0 "$offline_sync" 2>/dev/null || {
    wait_client "$offline_sync" "sync while offline"
    die "sync ended while offline: $(cat "$work/sync-offline.json")"
  }
  check_server
  sleep 1
done
client "$work/status-offline.json" status || die "status failed"
dead=$(json_field "$work/status-offline.json" dead)
attempts=$(json_field "$work/status-offline.json" attemptsSpent)
runs=$(json_field "$work/status-offline.json" runsStarted)
pending=$(json_field "$work/status-offline.json" pending)
say "  after ${offline_seconds} s offline: $pending tasks queued, dead tasks $dead, attempts spent $attempts while offline ($runs runs started; read from the store by notes-client status)"
[ "$dead" -eq 0 ] && [ "$attempts" -eq 0 ] || die "offline spent attempts or killed tasks" 6
event "{\"event\":\"online\",\"t\":$(now_ms)}"
rm -f "$net/offline"
wait_client "$offline_sync" "sync after coming online"
say "  online again: $(cat "$work/sync-offline.json")"
read_after_push

# 2. A refresh after a push: the notes cache is fresh (max age 1 h), so only the keys the pushed
#    tasks invalidate make the next read fetch.
say "[2/6] edits, push, read"
for i in 1 2 3 4; do ask edit "o$i" "offline note $i v3" online; done
sync_now 30
read_after_push

# 3. The client killed by SIGKILL mid-request: the server answers 300 ms after it applied and
#    recorded a change, and the kill lands in that window or around it.
say "[3/6] kill -9 of the client mid-request (at least 20)"
control '{"delayMs":300}'
kills=0
round=0
while [ "$kills" -lt "$kill_target" ] && [ "$round" -lt $((kill_target * 2)) ]; do
  round=$((round + 1))
  ask create "k$round" "kill note $round" kill
  ask edit "k$round" "kill note $round v1" kill
  if [ "$round" -gt 1 ]; then ask edit "k$((round - 1))" "kill note $((round - 1)) v2" kill; fi
  client_background "$work/sync-kill.json" sync --for 30
  pid=$last_pid
  sleep "0.$((30 + RANDOM % 60))"
  killed_at=$(now_ms)
  kill -9 "$pid" 2>/dev/null || true
  status=0
  # (bash's own "Killed" notice for the job is not news here.)
  { wait "$pid" || status=$?; } 2>/dev/null
  if [ "$status" -eq 137 ]; then
    kills=$((kills + 1))
    event "{\"event\":\"kill\",\"t\":$killed_at,\"delayMs\":300}"
  elif [ "$status" -ge 128 ]; then
    die "a sync died by signal $((status - 128)) before it was killed" 4
  fi
  check_server
done
[ "$kills" -ge 20 ] || say "  only $kills kills landed (the queue emptied before the others)"
control '{"delayMs":0}'
sync_now 60
say "  $kills kills in $round rounds; then: $(cat "$work/sync.json")"
read_after_push

# 4. Server 500s (before and after the apply) and two server restarts on the same record.
say "[4/6] server 500s and restarts"
outages=1
control '{"failRate":0.3,"failAfterApplyShare":0.5,"delayMs":150}'
for i in 1 2 3 4 5 6 7 8; do ask create "r$i" "restart note $i" restart; done
for i in 1 2 3 4 5 6 7 8; do ask edit "r$i" "restart note $i v1" restart; done
for i in 1 2 3 4 5 6 7 8; do ask edit "r$i" "restart note $i v2" restart; done
client_background "$work/sync-restart.json" sync --for 90
restart_sync=$last_pid
# Each kill lands while the sync is under way (24 changes at 150 ms each, 4 at a time, take
# longer than this), most of them inside an answer's delay.
restarts_during_sync=0
for _ in 1 2; do
  sleep 0.5
  if kill -0 "$restart_sync" 2>/dev/null; then restarts_during_sync=$((restarts_during_sync + 1)); fi
  kill_server
  outages=$((outages + 1))
  sleep 0.8
  start_server --fail-rate 0.3 --fail-after-apply 0.5 --delay-ms 150
done
wait_client "$restart_sync" "sync across server restarts"
say "  after $((outages - 1)) restarts ($restarts_during_sync while the sync ran): $(cat "$work/sync-restart.json")"
control '{"failRate":0,"delayMs":0}'
read_after_push

# 5. A change the server refuses (400) until the user fixes it, and an edit queued behind it.
say "[5/6] a 400 the user fixes"
ask create u1 "BAD title" user
ask edit u1 "user note v1" user
client "$work/sync.json" sync --for 20 || die "sync with a refused change did not settle"
client "$work/status-user.json" status || die "status failed"
blocked=$(json_field "$work/status-user.json" blocked)
[ "$blocked" -eq 1 ] || die "the refused change is not waiting for the user: $(cat "$work/status-user.json")"
client "$work/fix.json" fix u1 "fixed title" || die "fix failed"
echo "{\"kind\":\"fix\",\"localId\":\"u1\",\"title\":\"fixed title\"}" >>"$work/asked.jsonl"
sync_now 20
say "  1 change refused (400), fixed by the user and resolved: $(cat "$work/sync.json")"
read_after_push

# 6. Two client processes syncing one store at once, while a third adds.
say "[6/6] two client processes on one store"
control '{"delayMs":40}'
for i in 1 2 3 4 5 6 7 8; do ask create "p$i" "pair note $i" pair; done
for i in 1 2 3 4 5 6 7 8; do ask edit "p$i" "pair note $i v1" pair; done
client_background "$work/sync-a.json" sync --for 60
sync_a=$last_pid
client_background "$work/sync-b.json" sync --for 60
sync_b=$last_pid
for i in 1 2 3 4; do ask edit "p$i" "pair note $i v2" pair; done
wait_client "$sync_a" "sync A"
wait_client "$sync_b" "sync B"
control '{"delayMs":0}'
sync_now 30
read_after_push
check_server

say "scenarios done in $(($(date +%s) - started_at)) s; checking the server's record"
verdict=0
verdict_out=$(python3 "$package/check.py" "$work" "$kills" "$outages") || verdict=$?
# The verdict line led by the mode: "batch16 sync e2e: …".
echo "$verdict_out" | sed '$ s/^/'"$FERRY_E2E_MODE"' /'
# The verdict's line is the last one printed; check.py listed what failed above it.
[ "$verdict" -eq 0 ] || exit 2
