/* A C program embedding CPython: runs the script named by argv[1] in the interpreter it
 * links (libpython, shared). pyebpf must find it through the mapped libpython although the
 * executable is not called python. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCRIPT\n", argv[0]);
        return 2;
    }
    FILE *script = fopen(argv[1], "r");
    if (!script) {
        perror(argv[1]);
        return 2;
    }
    Py_Initialize();
    int rc = PyRun_SimpleFileEx(script, argv[1], 1);
    if (Py_FinalizeEx() < 0) {
        return 120;
    }
    return rc == 0 ? 0 : 1;
}
