# Burns argv[1] seconds of its own CPU time in work(), then prints `cpu SECONDS`: the utime +
# stime the kernel accounted to this process (times(2), the figures of /proc/PID/stat; the sid
# root has no /proc), what a sampler at R Hz should turn into about SECONDS × R samples.
import os
import sys
import time


def work(seconds):
    end = time.process_time() + seconds
    n = 0
    while time.process_time() < end:
        n = (n * 31 + 7) % 1000003


work(float(sys.argv[1]))
times = os.times()
print(f"cpu {times.user + times.system:.3f}", flush=True)
