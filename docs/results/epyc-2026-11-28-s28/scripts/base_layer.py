# What layer_ab.py and e2e_ab.py share: main's layer_step.cpp before session 28 (BASE), built under its own op
# namespace (torch.ops.eaglespec_base.layer_step) next to the current kernels, whose ops it calls through the
# dispatcher; and BASE's forward loop over the layers (one op call a layer from Python).
import subprocess, tempfile
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from eaglespec.runtime import model as model_mod

BASE = "e079b43"  # main before session 28
ROOT = Path(__file__).resolve().parents[4]


def build_base_op():
    """torch.ops.eaglespec_base.layer_step, compiled from BASE's source (call after the current kernels loaded)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{BASE}:eaglespec/runtime/kernels/layer_step.cpp"],
                         check=True, capture_output=True, text=True).stdout
    src = src.replace("TORCH_LIBRARY_FRAGMENT(eaglespec, ", "TORCH_LIBRARY(eaglespec_base, ")
    src = src.replace("TORCH_LIBRARY_IMPL(eaglespec, ", "TORCH_LIBRARY_IMPL(eaglespec_base, ")
    tmp = Path(tempfile.mkdtemp())
    (tmp / "layer_step_base.cpp").write_text(src)
    load(name="layer_step_base", sources=[str(tmp / "layer_step_base.cpp")], extra_cflags=["-O3", "-mavx512f", "-mf16c"],
         build_directory=str(tmp), is_python_module=False, verbose=False)
    return torch.ops.eaglespec_base.layer_step


def per_layer(op):
    """A Transformer._layer_steps that calls ``op`` (a layer_step) once a layer, as BASE did."""
    def _layer_steps(self, x, rope, cache, plan, wanted, saved):
        a = self.args
        call = model_mod.LayerStepCall(plan, x.shape[1], rope, a.num_attention_heads, a.num_key_value_heads,
                                       a.rms_norm_eps)
        for i, weights in enumerate(self.layer_steps):
            x = op(x, None, *weights, call.cos, call.sin, cache.k[i], cache.v[i], plan.rows, plan.write_slots,
                   call.first, plan.n_slots, call.mask, *call.shape)
            if i + 1 in wanted:
                saved[i + 1] = x
        return x
    return _layer_steps
