# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Every ctypes struct in python/kvfabric/_lib.py has the size, field names
and field offsets of the C struct its docstring names, as the C compiler
of this build lays it out (ctypes_layout.c, built by meson)."""
import ctypes
import os
import subprocess

import pytest

from kvfabric import _lib


def c_layouts():
    exe = os.environ.get("KVF_LAYOUT_DUMP")
    if not exe:
        pytest.skip("KVF_LAYOUT_DUMP not set: run through meson test")
    out = subprocess.run([exe], check=True, capture_output=True,
                         text=True).stdout
    layouts = {}
    for line in out.splitlines():
        words = line.split()
        if words[0] == "struct":
            layouts[words[1]] = {"size": int(words[2]), "fields": {}}
        else:
            layouts[words[1]]["fields"][words[2]] = (int(words[3]),
                                                     int(words[4]))
    return layouts


def py_structs():
    return {name: cls for name, cls in vars(_lib).items()
            if isinstance(cls, type) and issubclass(cls, ctypes.Structure)
            and cls is not ctypes.Structure}


def test_every_struct_is_known_to_the_c_side():
    layouts = c_layouts()
    structs = py_structs()
    assert structs, "no ctypes structs found in kvfabric._lib"
    for name, cls in structs.items():
        ctype = (cls.__doc__ or "").strip()
        assert ctype in layouts, \
            f"{name}: docstring {ctype!r} names no struct ctypes_layout.c prints"


@pytest.mark.parametrize("name", sorted(py_structs()))
def test_struct_matches_c_layout(name):
    cls = py_structs()[name]
    c = c_layouts()[cls.__doc__.strip()]
    py_fields = [f[0] for f in cls._fields_]
    assert py_fields == list(c["fields"]), f"{name}: field names or order"
    for field in py_fields:
        off, size = c["fields"][field]
        desc = getattr(cls, field)
        assert (desc.offset, desc.size) == (off, size), \
            f"{name}.{field}: ctypes offset {desc.offset} size {desc.size}, " \
            f"C offset {off} size {size}"
    assert ctypes.sizeof(cls) == c["size"], f"{name}: sizeof"
