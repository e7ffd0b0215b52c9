# asyncio with one CPU-bound task, for `pyebpf dump --async`: "cruncher" burns CPU in crunch()
# for 50 ms at a time between two `await asyncio.sleep(0)`, so the event loop's thread is on a
# CPU running it almost all the time; "idle-1" and "idle-2" wait on an Event that is never set.
import asyncio
import time


def crunch(seconds):
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:  # LINE:crunch_loop
        x = (x * 31 + 7) % 1000003  # LINE:crunch


async def cruncher():
    while True:
        crunch(0.05)  # LINE:cruncher
        await asyncio.sleep(0)  # LINE:cruncher_yield


async def idle(stop):
    await stop.wait()  # LINE:idle


async def main():
    stop = asyncio.Event()
    asyncio.current_task().set_name("main")
    tasks = [
        asyncio.create_task(cruncher(), name="cruncher"),
        asyncio.create_task(idle(stop), name="idle-1"),
        asyncio.create_task(idle(stop), name="idle-2"),
    ]
    await asyncio.sleep(0.1)
    print("ready", flush=True)
    await asyncio.gather(*tasks)  # LINE:main


asyncio.run(main())
