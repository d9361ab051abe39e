"""The package's declarations (rlorch/_ffi.py, ctypes: nothing is compiled
against the header) against the real header: every function the header
declares is declared with its argument types and result type, every struct
has the header's fields in the header's order, and every struct's size,
every field's offset and size and every constant's value are those a C
compiler gives.

    py_abi.py INCLUDE_DIR CC

Prints "ok ..." / "FAIL ..." lines; exits 1 on a difference."""
import ctypes
import os
import re
import subprocess
import sys
import tempfile

from rlorch import _ffi


def _body(header):
    # The declarations alone: no comments, no preprocessor lines but #define.
    text = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    return "\n".join(ln for ln in text.split("\n") if not ln.startswith("#") or
                     ln.startswith("#define"))


def _field_names(body):
    names = []
    for decl in body.split(";"):
        for piece in decl.split(","):
            m = re.search(r"(\w+)\s*(?:\[\s*\d+\s*\])?\s*$", piece)
            if m:
                names.append(m.group(1))
    return names


def main():
    inc, cc = sys.argv[1], sys.argv[2]
    header = _body(open(os.path.join(inc, "rlorch", "rlorch.h")).read())
    fails = 0

    def check(ok, what):
        nonlocal fails
        fails += not ok
        print(("ok " if ok else "FAIL ") + what)

    # Functions: each declared, with as many argument types as the prototype has.
    protos = dict(re.findall(r"\b(rlorch_[a-z_]+)\(([^()]*)\);", header))
    ours = _ffi.FUNCTIONS
    check(set(protos) == set(ours),
          f"functions: header {len(protos)}, package {len(ours)}, "
          f"missing {sorted(set(protos) - set(ours))}, extra {sorted(set(ours) - set(protos))}")
    for name, params in sorted(protos.items()):
        if name not in ours:
            continue
        n = 0 if params.strip() == "void" else len(params.split(","))
        fn = getattr(_ffi.lib, name)
        restype, argtypes = ours[name]
        void = re.search(r"\bvoid\s+" + name + r"\(", header) is not None
        check(fn.argtypes is not None and len(fn.argtypes) == n and list(fn.argtypes) == argtypes
              and fn.restype is restype and (restype is None) == void,
              f"{name}: {n} argument types and a {'void' if void else 'value'} result declared")

    # Callback types: as many arguments as the header's typedef, and its result.
    cbs = {name: (res, params) for res, name, params in
           re.findall(r"typedef (\w+) \(\*(rlorch_\w+)\)\(([^()]*)\);", header)}
    check(set(cbs) == set(_ffi.CALLBACKS), f"callback types: header {sorted(cbs)}, "
                                           f"package {sorted(_ffi.CALLBACKS)}")
    results = {"void": None, "int": ctypes.c_int}
    for name, (res, params) in sorted(cbs.items()):
        t = _ffi.CALLBACKS.get(name)
        check(t is not None and len(t._argtypes_) == len(params.split(",")) and
              res in results and t._restype_ is results[res],
              f"{name}: {len(params.split(','))} arguments, result {res}")

    # Structs: the header's fields in its order, then the C compiler's layout.
    structs = dict(re.findall(r"typedef struct (rlorch_\w+) \{(.*?)\} \1;", header, flags=re.S))
    ours = {s.__name__: s for s in _ffi.STRUCTS}
    check(set(structs) == set(ours), f"structs: header {sorted(structs)}, package {sorted(ours)}")
    lines, want = [], []
    nfields = 0
    for s in sorted(set(structs) & set(ours)):
        cls = ours[s]
        names = [f for f, *_ in cls._fields_]
        theirs = _field_names(structs[s])
        check(names == theirs, f"{s}: the header's {len(theirs)} fields in its order"
                               f"{'' if names == theirs else f' (package {names}, header {theirs})'}")
        lines.append(f'printf("sizeof {s} %zu\\n", sizeof({s}));')
        want.append(f"sizeof {s} {ctypes.sizeof(cls)}")
        for f in names:
            d = getattr(cls, f)
            nfields += 1
            lines.append(f'printf("offsetof {s}.{f} %zu size %zu\\n", offsetof({s}, {f}), '
                         f'sizeof((({s} *)0)->{f}));')
            want.append(f"offsetof {s}.{f} {d.offset} size {d.size}")

    # Constants: every enum value and #define of the header, by name.
    consts = re.findall(r"\b(RLORCH_[A-Z0-9_]+) = ", header) + \
        [c for c in re.findall(r"#define (RLORCH_[A-Z0-9_]+) ", header)]
    for e in consts:
        lines.append(f'printf("value {e} %lld\\n", (long long){e});')
        want.append(f"value {e} {getattr(_ffi, e, 'missing')}")
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
          f"{len(ours)} structs, {nfields} fields, {len(consts)} constants "
          f"as the C compiler lays them out{': ' + '; '.join(diff) if diff else ''}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
