# A task tree in the shape of pyperformance's async_tree benchmark
# (`AsyncTree.recurse_with_task_group` / `recurse_with_gather`), for `--async`: thousands of
# short-lived tasks a second, every one named by asyncio's default (`Task-<n>`).
#
#   main (the asyncio.run task, default name) loops over trees, awaiting in its own task
#   AsyncTree.recurse_with_task_group(DEPTH): a TaskGroup of BRANCHES tasks running
#     AsyncTree.recurse_with_gather(DEPTH-1): a gather of BRANCHES tasks running
#       AsyncTree.recurse_with_task_group(DEPTH-2) ... alternating down to level 0, whose
#         task awaits AsyncTree.leaf(): a CPU-bound crunch() for half the leaves, a yield to
#         the loop (sleep(0), standing for I/O) for the others.
#   ingest (a task the program named, `create_task(..., name="ingest")`) runs beside the tree:
#     it crunches a little and yields, forever.
#
# So the task p steps below main (p = 1 .. DEPTH) runs recurse_with_gather when p is odd and
# recurse_with_task_group when p is even, at level DEPTH - p. The workload counts the tasks it
# created and writes {"tasks": N, "trees": M} to the file it names before `ready`
# (`stats_file PATH`), every 0.1 s. Arguments: DEPTH (default 5) and BRANCHES (default 3).
import asyncio
import json
import os
import random
import sys
import threading

DEPTH = int(sys.argv[1]) if len(sys.argv) > 1 else 5
BRANCHES = int(sys.argv[2]) if len(sys.argv) > 2 else 3
CPU_SHARE = 0.5
CRUNCH = 2000
STATS_FILE = f"/tmp/pyebpf-task-tree-{os.getpid()}.json"
STATS = {"tasks": 0, "trees": 0}


def crunch(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


class AsyncTree:
    def __init__(self):
        self.rng = random.Random(7)

    async def leaf(self):
        if self.rng.random() < CPU_SHARE:
            return crunch(CRUNCH)
        await asyncio.sleep(0)

    async def recurse_with_task_group(self, level):
        if level == 0:
            await self.leaf()
            return
        async with asyncio.TaskGroup() as tg:
            for _ in range(BRANCHES):
                tg.create_task(self.recurse_with_gather(level - 1))
        STATS["tasks"] += BRANCHES

    async def recurse_with_gather(self, level):
        if level == 0:
            await self.leaf()
            return
        # gather wraps each coroutine in a task of its own.
        await asyncio.gather(
            *[self.recurse_with_task_group(level - 1) for _ in range(BRANCHES)]
        )
        STATS["tasks"] += BRANCHES


async def ingest():
    while True:
        crunch(CRUNCH)
        await asyncio.sleep(0)


def report():
    tmp = STATS_FILE + ".tmp"
    while True:
        with open(tmp, "w") as f:
            json.dump(dict(STATS), f)
        os.replace(tmp, STATS_FILE)
        threading.Event().wait(0.1)


async def main():
    tree = AsyncTree()
    named = asyncio.create_task(ingest(), name="ingest")
    await tree.recurse_with_task_group(DEPTH)
    print("stats_file", STATS_FILE)
    print("ready", flush=True)
    while True:
        await tree.recurse_with_task_group(DEPTH)
        STATS["trees"] += 1
    await named


if __name__ == "__main__":
    threading.Thread(target=report, daemon=True).start()
    asyncio.run(main())
