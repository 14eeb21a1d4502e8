#!/usr/bin/env bash
# every 10 s: cpu jiffies deltas (user nice system idle iowait), MemAvailable, Cached, pressure avg10
prev=($(head -1 /proc/stat))
while true; do
  sleep 10
  cur=($(head -1 /proc/stat))
  u=$((cur[1]-prev[1])); n=$((cur[2]-prev[2])); s=$((cur[3]-prev[3])); i=$((cur[4]-prev[4])); w=$((cur[5]-prev[5]))
  prev=("${cur[@]}")
  ma=$(awk '/MemAvailable/{print int($2/1024)}' /proc/meminfo); ca=$(awk '/^Cached/{print int($2/1024)}' /proc/meminfo)
  pc=$(awk '/some/{print $2}' /proc/pressure/cpu); pi=$(awk '/some/{print $2}' /proc/pressure/io); pm=$(awk '/some/{print $2}' /proc/pressure/memory)
  echo "$(date +%H:%M:%S) user=$u nice=$n sys=$s idle=$i iowait=$w availMB=$ma cachedMB=$ca cpu_$pc io_$pi mem_$pm"
done
