# Shared by this folder's kernel experiments: a variant of one of the project's C++ kernels, built on its own as a
# separate op library (its namespace renamed, so it loads beside the project's), with the project's build flags.
import re
import tempfile
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from eaglespec.runtime import cpu_kernels

KERNELS = Path(cpu_kernels.__file__).with_name("kernels")
WORK = Path(tempfile.mkdtemp())


def source(name: str) -> str:
    return (KERNELS / name).read_text()


def replace_once(s: str, old: str, new: str) -> str:
    assert s.count(old) == 1, old
    return s.replace(old, new)


def build(name: str, src: str):
    """Build ``src`` (a kernel source including layer_parts.h) as torch.ops.<name>; returns that namespace."""
    src = src.replace("eaglespec_kernels", f"k_{name}").replace('"layer_parts.h"', f'"parts_{name}.h"')
    src = re.sub(r"TORCH_LIBRARY(_FRAGMENT|_IMPL)?\(eaglespec,", rf"TORCH_LIBRARY\1({name},", src)
    (WORK / f"parts_{name}.h").write_text(source("layer_parts.h").replace("eaglespec_kernels", f"k_{name}"))
    (WORK / f"{name}.cpp").write_text(src)
    load(name=name, sources=[str(WORK / f"{name}.cpp")], extra_cflags=cpu_kernels._FLAGS, extra_ldflags=["-fopenmp"],
         is_python_module=False, build_directory=str(WORK))
    return getattr(torch.ops, name)
