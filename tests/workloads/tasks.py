# asyncio tasks with known CPU shares and a three-level awaiter chain, for `--async`.
#
#   main ("main", the asyncio.run task)
#     awaits parent ("parent"), which
#       runs gamma ("gamma") in a TaskGroup, and
#       awaits supervise(), which gathers alpha ("alpha") and beta ("beta").
#
# Each leaf task loops: burn its own CPU slice (ALPHA 4 ms, BETA 2 ms, GAMMA 1 ms of thread CPU
# time), then `await asyncio.sleep(0)`, so the loop runs them round-robin and their CPU shares
# are fixed by the slices. Each task also measures its own CPU time (time.thread_time from
# each resumption to its next suspension); a helper thread writes the totals, as JSON {task: seconds}, to the file it
# names before `ready` (`shares_file PATH`), every 0.1 s, so a test can compare what pyebpf
# attributed to each `<task NAME>` with what the tasks measured over the same window.
import asyncio
import json
import os
import sys
import threading
import time

SLICES = {"alpha": 0.004, "beta": 0.002, "gamma": 0.001}
CPU = {name: 0.0 for name in SLICES}
RESUMED = {name: 0.0 for name in SLICES}
SHARES_FILE = f"/tmp/pyebpf-tasks-{os.getpid()}.json"


def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def step(name):
    burn(SLICES[name])
    # Everything the task ran since it was last resumed: its burn and its share of the
    # coroutine plumbing, which pyebpf attributes to the task too.
    CPU[name] += time.thread_time() - RESUMED[name]
    await asyncio.sleep(0)
    RESUMED[name] = time.thread_time()


async def alpha():
    RESUMED["alpha"] = time.thread_time()
    while True:
        await step("alpha")


async def beta():
    RESUMED["beta"] = time.thread_time()
    while True:
        await step("beta")


async def gamma():
    RESUMED["gamma"] = time.thread_time()
    while True:
        await step("gamma")


async def supervise():
    await asyncio.gather(
        asyncio.create_task(alpha(), name="alpha"),
        asyncio.create_task(beta(), name="beta"),
    )


async def parent():
    async with asyncio.TaskGroup() as tg:
        tg.create_task(gamma(), name="gamma")
        await supervise()


def report():
    tmp = SHARES_FILE + ".tmp"
    while True:
        with open(tmp, "w") as f:
            json.dump(dict(CPU), f)
        os.replace(tmp, SHARES_FILE)
        time.sleep(0.1)


async def main():
    asyncio.current_task().set_name("main")
    task = asyncio.create_task(parent(), name="parent")
    await asyncio.sleep(0.05)
    print("shares_file", SHARES_FILE)
    print("ready", flush=True)
    await task


if __name__ == "__main__":
    threading.Thread(target=report, daemon=True).start()
    asyncio.run(main())
