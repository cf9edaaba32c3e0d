#!/bin/bash
# bench/kit/t33-ab.sh BUILD LINES ANSWER_BYTES LABEL
#
# One run of the adversarial kit's t33 (a batch whose output is LINES answers of ANSWER_BYTES each, from
# the kit's bigupstream.py engine) against the router of BUILD (a built checkout: BUILD/bin/switchyard.js),
# with the kit's probe.py (GET /healthz every 5 ms, its worst stalls) and mon.sh (the router's CPU % and
# RSS every 5 s) beside it; then the output is downloaded and its lines counted, and the Redis keys left
# are listed. Run it for the build before and the build after, one after the other (same machine, same
# minute): the figures are read against each other.
#   WORK (default /tmp/swy-kit-t33): a copy of the kit (../shared/repro/adversarial-2, or KIT) plus these
#   files; ports 28097 (router), 28192 (engine), 26379 (redis-server, started and stopped here).
# Outputs: $WORK/t33-LABEL.out, probe-LABEL.out, mon-LABEL.out.
set -u
B=$(cd "$1" && pwd); N=$2; SZ=$3; L=$4
HERE=$(cd "$(dirname "$0")" && pwd)
KIT=${KIT:-$HERE/../../../shared/repro/adversarial-2}
WORK=${WORK:-/tmp/swy-kit-t33}
mkdir -p "$WORK"
cp "$KIT"/spawn.sh "$KIT"/bigupstream.py "$KIT"/probe.py "$WORK"/
cp "$HERE"/mon.sh "$HERE"/t33_long.py "$HERE"/router13.yaml "$WORK"/
cd "$WORK"
redis-server --port 26379 --save '' --daemonize yes --dir "$WORK" --pidfile "$WORK"/redis.pid >/dev/null; sleep 0.5
redis-cli -p 26379 flushall >/dev/null
DIR=$WORK ./spawn.sh bigup python3 bigupstream.py 28192 "$SZ"
DIR=$WORK ./spawn.sh router13 node "$B"/bin/switchyard.js serve --config router13.yaml
sleep 3
./mon.sh "$(cat router13.pid)" 400 > "mon-$L.out" &
python3 probe.py 28097 80 > "probe-$L.out" &
PP=$!
python3 t33_long.py 300 "$N" > "t33-$L.out" 2>&1
OUT=$(grep -o "output_file_id file-[0-9a-f]*-output" "t33-$L.out" | awk '{print $2}')
if [ -n "$OUT" ]; then
  sleep 5
  echo "download: $(curl -s -o "$WORK"/dl.out -w '%{http_code} %{size_download} %{time_total}s' "localhost:28097/v1/files/$OUT/content") lines $(wc -l < "$WORK"/dl.out) distinct custom_ids $(grep -o '"custom_id":"c[0-9]*"' "$WORK"/dl.out | sort -u | wc -l)" >> "t33-$L.out"
  rm -f "$WORK"/dl.out
fi
sleep 2
echo "redis keys:" >> "t33-$L.out"
redis-cli -p 26379 --scan --pattern 'sw13:file:*' | while read -r k; do echo "$k $(redis-cli -p 26379 type "$k") $(redis-cli -p 26379 memory usage "$k")"; done >> "t33-$L.out"
wait $PP
kill "$(cat router13.pid)" "$(cat bigup.pid)" 2>/dev/null; sleep 1
redis-cli -p 26379 shutdown nosave >/dev/null 2>&1
pkill -f "mon.sh $(cat router13.pid)" ; true
