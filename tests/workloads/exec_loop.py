# Compiles and runs a fresh function fn_<i> every few milliseconds, dropping the previous one,
# so new code objects (and their strings) keep landing at freed ones' addresses.
# Prints how many distinct code-object addresses the run used, at exit (after argv[1] rounds).
import gc
import sys

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 100
TEMPLATE = """
def fn_{i}():
    n = 0
    for k in range(400000):
        n = (n * 31 + k) % 1000003
    return n
"""

print("ready", flush=True)
addresses = set()
for i in range(ROUNDS):
    ns = {}
    exec(compile(TEMPLATE.format(i=i), f"<gen {i}>", "exec"), ns)
    fn = ns[f"fn_{i}"]
    addresses.add(id(fn.__code__))
    fn()
    del fn, ns
    gc.collect()
print(f"distinct {len(addresses)} of {ROUNDS}", flush=True)
