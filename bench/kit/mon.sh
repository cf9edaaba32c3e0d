#!/bin/bash
# mon.sh PID SECONDS: every 5 s, the process's CPU % over the interval (from /proc stat), RSS, loadavg
pid=$1; end=$(( $(date +%s) + $2 )); hz=$(getconf CLK_TCK)
prev=$(awk '{print $14+$15}' /proc/$pid/stat); pt=$(date +%s.%N)
while [ $(date +%s) -lt $end ] && [ -e /proc/$pid ]; do
  sleep 5
  cur=$(awk '{print $14+$15}' /proc/$pid/stat); ct=$(date +%s.%N)
  echo "$(date +%T) cpu $(echo "scale=0; 100*($cur-$prev)/$hz/($ct-$pt)" | bc)% rss $(grep VmRSS /proc/$pid/status | awk '{print int($2/1024)}')MB load $(cut -d' ' -f1-3 /proc/loadavg)"
  prev=$cur; pt=$ct
done
