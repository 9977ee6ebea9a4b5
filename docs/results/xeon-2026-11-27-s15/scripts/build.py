# Builds a kernel source of this folder (NAME.cpp, its ops registered under torch.ops.NAME) beside the project's
# own build, with the project's compiler flags, so that two versions of a kernel run in one process.
import os
import tempfile
from pathlib import Path

from torch.utils.cpp_extension import load

from eaglespec.runtime.cpu_kernels import _FLAGS

HERE = Path(__file__).resolve().parent


def build(name, src_dir=HERE):
    """``src_dir``: the folder holding NAME.cpp (this one unless a later session's script says otherwise)."""
    d = Path(tempfile.gettempdir()) / f"eaglespec_scratch_{name}"
    os.makedirs(d, exist_ok=True)
    load(name=name, sources=[str(Path(src_dir) / f"{name}.cpp")], extra_cflags=_FLAGS, extra_ldflags=["-fopenmp"],
         build_directory=str(d), is_python_module=False, verbose=False)
