#!/usr/bin/env bash
# Power loss, not just process death: run the crash workload on a small loop-mounted ext4 image
# (commit=60: nothing reaches the image unless something forces it, as fsync does), kill the
# worker, copy the image as it stands at that instant, mount the copy (ext4 replays its journal,
# as after a reboot) and run the crash checks on it. What was fsynced survives; what was only in
# the page cache is gone, like after a real power cut. See Specs/crash-model.md for the limits.
#
# Needs root, loop devices and mkfs.ext4; where they are missing it says "skipped" and exits 0.
# FERRY_POWER_LOSS_ROUNDS sets the number of power cuts (default 6).
set -uo pipefail
cd "$(dirname "$0")/.."

skip() { echo "power-loss: skipped ($1)"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "needs root"
command -v losetup >/dev/null && command -v mkfs.ext4 >/dev/null && command -v mount >/dev/null || skip "needs losetup, mkfs.ext4 and mount"
losetup -f >/dev/null 2>&1 || skip "no free loop device"

worker=.build/debug/ferry-crash-worker
if [ ! -x "$worker" ]; then
  swift build --product ferry-crash-worker >/dev/null 2>&1 || { echo "power-loss: could not build the crash worker"; exit 1; }
fi

work=$(mktemp -d /tmp/ferry-power-loss.XXXXXX)
live="$work/live"
copy="$work/copy"
mkdir -p "$live" "$copy"
cleanup() {
  mountpoint -q "$copy" && umount "$copy"
  mountpoint -q "$live" && umount "$live"
  rm -rf "$work"
}
trap cleanup EXIT

truncate -s 256M "$work/disk.img"
mkfs.ext4 -q -F "$work/disk.img" || skip "mkfs.ext4 failed"
mount -o loop,commit=60 "$work/disk.img" "$live" 2>/dev/null || skip "cannot mount a loop device here"

# The method must lose what was not flushed, or it proves nothing: a file written without fsync
# must be gone from a copy, and a file fsynced must be there.
echo "not flushed" > "$live/unsynced"
python3 -c "import os,sys; f=open(sys.argv[1],'w'); f.write('flushed'); f.flush(); os.fsync(f.fileno()); f.close(); d=os.open(sys.argv[2], os.O_RDONLY); os.fsync(d)" "$live/synced" "$live" 2>/dev/null \
  || { dd if=/dev/zero of="$live/synced" bs=4096 count=1 conv=fsync status=none; }
cp --sparse=always "$work/disk.img" "$work/copy.img"
mount -o loop "$work/copy.img" "$copy" || skip "the copied image does not mount"
method="ok"
[ -e "$copy/unsynced" ] && [ -s "$copy/unsynced" ] && method="an unflushed file survived the copy: this machine does not model power loss"
[ -s "$copy/synced" ] || method="an fsynced file was lost in the copy"
umount "$copy"
rm -f "$work/copy.img" "$live/unsynced" "$live/synced"
if [ "$method" != "ok" ]; then skip "$method"; fi
echo "power-loss: method check passed (an unflushed file is lost in the copy, an fsynced one survives)"

rounds=${FERRY_POWER_LOSS_ROUNDS:-6}
acks="$work/acks.txt"   # outside the image: what the app was told is saved
: > "$acks"
acknowledged=0
lost=0
violations=0
for round in $(seq 1 "$rounds"); do
  seed=$(( (RANDOM << 15) | RANDOM ))
  FERRY_RANDOM_WRITEBACK=${FERRY_RANDOM_WRITEBACK:-1} "$worker" workload "$live/store" "$seed" >> "$acks" 2>/dev/null &
  pid=$!
  # From the second round on, a second process runs passes on the same store and acknowledges
  # what it sees committed: what a reader in another process saw must survive the cut too.
  beside=""
  if [ "$round" -gt 1 ]; then
    "$worker" runner "$live/store" "$(( seed + 1 ))" > "$work/beside.txt" 2>/dev/null &
    beside=$!
  fi
  sleep "0.$(( 3 + RANDOM % 7 ))"
  kill -9 "$pid" $beside 2>/dev/null
  wait "$pid" $beside 2>/dev/null
  if [ -n "$beside" ]; then cat "$work/beside.txt" >> "$acks"; fi
  # The power cut: the image as it is on its backing file right now, nothing flushed first.
  cp --sparse=always "$work/disk.img" "$work/copy.img"
  if ! mount -o loop "$work/copy.img" "$copy" 2>/dev/null; then
    echo "power-loss: round $round: the copied image does not mount"
    violations=$((violations + 1))
    continue
  fi
  result=$(timeout 120 "$worker" check "$copy/store" "$acks" 2>&1)
  status=$?
  umount "$copy"
  rm -f "$work/copy.img"
  round_lost=$(echo "$result" | sed -n 's/^lost //p')
  round_violations=$(echo "$result" | sed -n 's/^violations //p')
  round_acked=$(echo "$result" | sed -n 's/^acknowledged //p')
  lost=$((lost + ${round_lost:-0}))
  violations=$((violations + ${round_violations:-0}))
  acknowledged=${round_acked:-$acknowledged}
  if [ "$status" -ne 0 ] || [ "${round_lost:-1}" != 0 ] || [ "${round_violations:-1}" != 0 ]; then
    echo "power-loss: round $round (seed $seed) failed:"
    echo "$result" | sed 's/^/  /'
    [ -z "${round_violations:-}" ] && violations=$((violations + 1))
  fi
done
echo "power-loss: $rounds power cuts, $acknowledged acknowledged events, $lost lost, $violations invariant violations"
[ "$lost" -eq 0 ] && [ "$violations" -eq 0 ]
