"""Dump the location tables of real code objects together with the interpreter's own answers.

Runs under CPython 3.11+. Compiles a fixed list of standard-library modules from source (plus
a few synthetic sources exercising unusual table entries), walks every code object reachable
through co_consts, and prints one JSON object per line:

    {"name": co_qualname, "firstlineno": co_firstlineno, "linetable": co_linetable.hex(),
     "lines": [start line of each code unit per co_positions(), null where None]}

co_positions() yields one tuple per code unit (CACHE entries included); this script checks
that and exits non-zero if it does not hold.
"""

import json
import os
import sys
import sysconfig

MODULES = sorted(
    [
        "_pydecimal",
        "_pyio",
        "argparse",
        "ast",
        "base64",
        "bisect",
        "calendar",
        "collections",
        "configparser",
        "contextlib",
        "copy",
        "csv",
        "dataclasses",
        "datetime",
        "difflib",
        "dis",
        "email/message",
        "enum",
        "fnmatch",
        "fractions",
        "functools",
        "gettext",
        "heapq",
        "http/client",
        "inspect",
        "ipaddress",
        "json",
        "json/decoder",
        "logging",
        "optparse",
        "pathlib",
        "pickle",
        "pprint",
        "random",
        "re",
        "shlex",
        "shutil",
        "statistics",
        "string",
        "subprocess",
        "tarfile",
        "textwrap",
        "threading",
        "tokenize",
        "traceback",
        "typing",
        "unittest/case",
        "urllib/parse",
        "uuid",
        "warnings",
        "zipfile",
    ]
)

# Sources exercising rarer entries: big line jumps (multi-group varints), negative deltas
# (decorators, multi-line calls), wide columns (long form), generators/comprehensions.
SYNTHETIC = {
    "<synthetic-jumps>": (
        "def far():\n"
        "    x = 1\n" + "\n" * 70000 + "    return x\n"
        "\n"
        "def wide():\n"
        "    return " + " + ".join(["value_%d" % i for i in range(60)]) + "\n"
        "\n"
        "@staticmethod\n"
        "@classmethod\n"
        "def decorated(a,\n"
        "              b):\n"
        "    return (a\n"
        "            +\n"
        "            b)\n"
        "\n"
        "def gen(n):\n"
        "    yield from (i * i\n"
        "                for i in range(n)\n"
        "                if i % 3)\n"
        "    return [x for x in\n"
        "            range(n)]\n"
        "\n"
        "async def coro(a):\n"
        "    async with a as b:\n"
        "        await b\n"
        "    try:\n"
        "        pass\n"
        "    finally:\n"
        "        b = None\n"
        "\n"
        "class K:\n"
        "    def method(self):\n"
        "        return super().method()\n"
        "\n"
        "def _back():\n"
        "    return f(\n"
        "        1,\n"
        "        2,\n"
        "    )(\n"
        "        3)\n"
    ),
}


def module_path(stdlib, name):
    for candidate in (name + ".py", os.path.join(name, "__init__.py")):
        path = os.path.join(stdlib, candidate)
        if os.path.exists(path):
            return path
    return None


def walk(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, type(code)):
            yield from walk(const)


def dump(code, out):
    positions = list(code.co_positions())
    units = len(code.co_code) // 2
    if len(positions) != units:
        sys.exit(
            "%s: co_positions() gave %d entries for %d code units"
            % (code.co_qualname, len(positions), units)
        )
    record = {
        "name": code.co_qualname,
        "firstlineno": code.co_firstlineno,
        "linetable": code.co_linetable.hex(),
        "lines": [p[0] for p in positions],
    }
    out.write(json.dumps(record, separators=(",", ":")))
    out.write("\n")


def main():
    stdlib = sysconfig.get_paths()["stdlib"]
    sources = []
    for name in MODULES:
        path = module_path(stdlib, name)
        if path is None:
            print("dump_positions: skipping missing module %s" % name, file=sys.stderr)
            continue
        with open(path, "rb") as f:
            sources.append((path, f.read()))
    sources.extend((name, src) for name, src in sorted(SYNTHETIC.items()))

    out = sys.stdout
    count = 0
    for filename, source in sources:
        top = compile(source, filename, "exec", dont_inherit=True)
        for code in walk(top):
            dump(code, out)
            count += 1
    print("dump_positions: %d code objects" % count, file=sys.stderr)


if __name__ == "__main__":
    main()
