"""The package's declarations (rlorch/_ffi.py, cffi's ABI mode: nothing is
compiled against the header) against the real header: every function the
header declares is declared, and every struct's size, every field's offset
and every enum constant's value are those a C compiler gives.

    py_abi.py INCLUDE_DIR CC

Prints "ok ..." / "FAIL ..." lines; exits 1 on a difference."""
import os
import re
import subprocess
import sys
import tempfile

from rlorch._ffi import CDEF, ffi


def main():
    inc, cc = sys.argv[1], sys.argv[2]
    header = open(os.path.join(inc, "rlorch", "rlorch.h")).read()
    fails = 0

    def check(ok, what):
        nonlocal fails
        fails += not ok
        print(("ok " if ok else "FAIL ") + what)

    declared = set(re.findall(r"\b(rlorch_[a-z_]+)\(", header))
    ours = set(re.findall(r"\b(rlorch_[a-z_]+)\(", CDEF))
    check(declared == ours, f"functions: header {len(declared)}, package {len(ours)}, "
                            f"missing {sorted(declared - ours)}, extra {sorted(ours - declared)}")

    structs = sorted(set(re.findall(r"typedef struct (rlorch_[a-z_]+) \{", CDEF)))
    enums = re.findall(r"\b(RLORCH_[A-Z0-9_]+) = ", CDEF) + \
        re.findall(r"#define (RLORCH_[A-Z_]+) ", CDEF)
    lines, want = [], []
    for s in structs:
        lines.append(f'printf("sizeof {s} %zu\\n", sizeof({s}));')
        want.append(f"sizeof {s} {ffi.sizeof(s)}")
        for field, _ in ffi.typeof(s).fields:
            lines.append(f'printf("offsetof {s}.{field} %zu\\n", offsetof({s}, {field}));')
            want.append(f"offsetof {s}.{field} {ffi.offsetof(s, field)}")
    from rlorch._ffi import lib
    for e in enums:
        lines.append(f'printf("value {e} %lld\\n", (long long){e});')
        want.append(f"value {e} {getattr(lib, e)}")
    src = "#include <stddef.h>\n#include <stdio.h>\n#include <rlorch/rlorch.h>\nint main(void) {\n" + \
        "\n".join(lines) + "\nreturn 0;\n}\n"
    with tempfile.TemporaryDirectory() as d:
        c, exe = os.path.join(d, "abi.c"), os.path.join(d, "abi")
        open(c, "w").write(src)
        r = subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-I", inc, c, "-o", exe],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"the layout program compiles against the header {r.stderr.strip()}")
        if r.returncode:
            return 1
        got = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split("\n")[:-1]
    diff = [f"{w} (C: {g})" for w, g in zip(want, got) if w != g]
    check(len(got) == len(want) and not diff,
          f"{len(structs)} structs, {len(want) - len(enums) - len(structs)} fields, {len(enums)} constants "
          f"as the C compiler lays them out{': ' + '; '.join(diff) if diff else ''}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
