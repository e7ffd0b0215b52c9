# A short-lived interpreter: two threads burn CPU for argv[1] seconds in `short_main` and
# `short_helper`, printing "tid <native id>" for each, then the process exits.
import sys
import threading
import time

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.2


def burn(end):
    n = 0
    while time.monotonic() < end:
        n = (n * 31 + 7) % 1000003


def short_helper(end):
    burn(end)


def short_main():
    end = time.monotonic() + seconds
    helper = threading.Thread(target=short_helper, args=(end,))
    helper.start()
    print(f"tid {threading.get_native_id()}", flush=True)
    print(f"tid {helper.native_id}", flush=True)
    burn(end)
    helper.join()


short_main()
