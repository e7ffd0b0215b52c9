# A fixed asyncio task tree, idle, for `pyebpf dump --async`:
#   root (the main task) -> TaskGroup: parent-a, parent-b
#   parent-a -> gather(leaf-a1, leaf-a2)
#   parent-b -> awaits leaf-b1 directly
# Every leaf waits on an Event that is never set.
import asyncio


async def leaf(stop):
    await stop.wait()  # LINE:leaf


async def parent_a(stop):
    await asyncio.gather(
        asyncio.create_task(leaf(stop), name="leaf-a1"),
        asyncio.create_task(leaf(stop), name="leaf-a2"),
    )


async def parent_b(stop):
    await asyncio.create_task(leaf(stop), name="leaf-b1")


async def main():
    stop = asyncio.Event()
    asyncio.current_task().set_name("root")
    async with asyncio.TaskGroup() as group:
        group.create_task(parent_a(stop), name="parent-a")
        group.create_task(parent_b(stop), name="parent-b")
        await asyncio.sleep(0.2)
        print("ready", flush=True)


asyncio.run(main())
