"""Samples every process's CPU (user, sys seconds) and command line twice a second until the
file argv[1] exists, then writes {pid: [user, sys, command]} as JSON to argv[2].

Kernel threads report their CPU since boot; a process that exits between two samples loses
its last half second; a zombie's command line reads empty, so the last one seen is kept."""

import json
import os
import sys
import time


def sample(seen: dict[str, tuple[float, float, str]]) -> None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/cmdline") as cmdline:
                fields = stat.read().rsplit(")", 1)[1].split()
                command = cmdline.read().replace("\0", " ")[:150]
        except OSError:
            continue
        previous = seen.get(pid)
        command = command or (previous[2] if previous else "")
        seen[pid] = (int(fields[11]) / 100, int(fields[12]) / 100, command)


def main() -> None:
    seen: dict[str, tuple[float, float, str]] = {}
    while not os.path.exists(sys.argv[1]):
        sample(seen)
        time.sleep(0.5)
    with open(sys.argv[2], "w") as out:
        json.dump(seen, out)


if __name__ == "__main__":
    main()
