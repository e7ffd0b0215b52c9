# Busy work inside a generator consumed by a loop, and inside a coroutine awaited by another.
# argv[1] = "gen" or "async".
import asyncio
import sys


def work():
    n = 0
    for i in range(20000):
        n = (n * 31 + i) % 1000003
    return n


def produce():
    while True:
        yield work()  # LINE:produce


def consume():
    for _ in produce():  # LINE:consume
        pass


async def compute():
    while True:
        work()  # LINE:compute
        await asyncio.sleep(0)


async def main():
    await compute()  # LINE:main


print("ready", flush=True)
if sys.argv[1] == "gen":
    consume()
else:
    asyncio.run(main())
