"""`eaglespec interop`: load our head in the engines and trainers people already run, and compare.

For each consumer the check exports a head in that consumer's layout (``spec/layouts.py``), loads it with
the consumer's OWN loader inside the consumer's own virtual environment (a probe script from
``measure/consumers/``, run by that venv's python; eaglespec is not installed there), and compares:

* vllm: greedy generation with our head as vLLM's EAGLE-3 (or EAGLE-1) speculator, K draft tokens per
  round, on the same token-id prompts as ours: its tokens against OUR VANILLA tokens (lossless: they must be
  equal) and its accepted counts per draft position against ours (our engine, chain of K, batch 1).
* speculators, specforge: the loaded tensors against ours (bit-identical expected) and one parallel draft
  step over real target features: max |difference| of the output feature and of the logits, and how
  often the top draft token agrees; then the round trip: the directory the consumer reads (speculators) or
  writes (SpecForge ``save_pretrained``) loads strictly in eaglespec with the same tensors.
* llama.cpp: the head converted by llama.cpp's own ``convert_hf_to_gguf.py`` and run by
  ``llama-speculative-simple --spec-type draft-eagle3``: its draft acceptance rate against ours on the same
  prompts (its target is the Q4_1 GGUF itself, ours the dequantized weights: close, not equal).

Results: ``OUT/interop.json`` (every number) and ``OUT/summary.md`` (the README table). Consumers not
installed are reported as skipped with the command that installs them (``scripts/interop.sh``).
See docs/INTEROP.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("eaglespec")

CONSUMERS = ("vllm", "speculators", "specforge", "llama.cpp")
VENV_NAMES = {"vllm": "vllm", "speculators": "speculators", "specforge": "specforge", "llama.cpp": "llamacpp"}
PROBES = Path(__file__).resolve().parent / "consumers"
SETUP_HINT = "bash scripts/interop.sh --setup"


class InteropError(RuntimeError):
    """A consumer could not be run or refused the head (the message names the consumer and the step)."""


def default_venvs() -> Path:
    """``$EAGLESPEC_INTEROP_VENVS``, else ``~/.cache/eaglespec/interop`` (one venv per consumer inside)."""
    return Path(os.environ.get("EAGLESPEC_INTEROP_VENVS") or Path.home() / ".cache" / "eaglespec" / "interop")


def consumer_python(venvs: Path, consumer: str) -> Path:
    """The python of ``consumer``'s venv, or InteropError saying how to install it."""
    if consumer not in VENV_NAMES:
        raise InteropError(f"unknown consumer {consumer!r}: choose from {', '.join(CONSUMERS)}")
    python = venvs / VENV_NAMES[consumer] / "bin" / "python"
    if not python.is_file():
        raise InteropError(f"{consumer} is not installed: no {python} (install it with {SETUP_HINT})")
    return python


def run_probe(python: Path, script: str, request: dict, work: Path, env: dict | None = None,
              timeout_s: float = 1800) -> dict:
    """Run ``consumers/SCRIPT`` with ``python`` on ``request``; return its JSON result. The probe's output
    goes to ``work/SCRIPT.log``; a failure raises InteropError with the log's last lines."""
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    stem = Path(script).stem + request.get("tag", "")
    req_path, res_path, log_path = work / f"{stem}.request.json", work / f"{stem}.result.json", work / f"{stem}.log"
    req_path.write_text(json.dumps(request))
    res_path.unlink(missing_ok=True)
    # a probe must see its own venv only: no eaglespec on the path, no caller's PYTHONPATH
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | (env or {})
    with log_path.open("w") as sink:
        try:
            proc = subprocess.run([str(python), str(PROBES / script), str(req_path), str(res_path)],
                                  stdout=sink, stderr=subprocess.STDOUT, env=full_env, timeout=timeout_s,
                                  cwd=work)
        except subprocess.TimeoutExpired:
            raise InteropError(f"{script} ran past {timeout_s:.0f} s (log: {log_path})") from None
    if proc.returncode != 0 or not res_path.is_file():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise InteropError(f"{script} failed (exit {proc.returncode}; log: {log_path}):\n{tail}")
    return json.loads(res_path.read_text())


# ============================================================================================ our side
@dataclass
class Ours:
    """The reference numbers from our own engine on the interop prompts."""

    target: Any
    head_dir: Path
    prompts: list[list[int]]
    max_new_tokens: int
    vanilla: list[list[int]] = field(default_factory=list)
    eagle: dict[int, dict] = field(default_factory=dict)  # K -> {"outputs", "accepted_per_position", "rounds"}

    def run_vanilla(self) -> list[list[int]]:
        if not self.vanilla:
            self.vanilla = self._generate(None)["outputs"]
        return self.vanilla

    def run_eagle(self, k: int) -> dict:
        """Our chain-of-K speculation at batch 1: tokens, accepted counts per position, verification rounds."""
        if k not in self.eagle:
            from eaglespec.spec.speculative import DraftOptions, build_proposer

            proposer = build_proposer(self.target, DraftOptions(draft=str(self.head_dir), tree="chain", depth=k))
            self.eagle[k] = self._generate(proposer, k)
        return self.eagle[k]

    def _generate(self, proposer, k: int = 0) -> dict:
        from eaglespec.config import GenerationConfig
        from eaglespec.engine.generate import Engine, Request

        engine = Engine(self.target, proposer=proposer, max_batch_size=1)
        outputs, per_pos, rounds, wall = [], [0] * k, 0, 0.0
        with torch.inference_mode():
            for p in self.prompts:
                t0 = time.perf_counter()
                (done,) = engine.generate([Request(p, GenerationConfig(self.max_new_tokens, ignore_eos=True))])
                wall += time.perf_counter() - t0
                outputs.append(list(done.token_ids))
                rounds += done.stats.target_forwards
                for d, c in enumerate(done.stats.accepted_per_position[:k]):
                    per_pos[d] += int(c)
        return {"outputs": outputs, "accepted_per_position": per_pos, "rounds": rounds, "wall_s": round(wall, 3)}

    def draft_step(self, n_prompts: int = 2) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
        """Inputs of one parallel draft step per prompt (real target features) and our head's outputs.

        Pair i = (feature f_i, token t_{i+1}) at position i, as in training: features [1, T, 3H] float32,
        tokens / positions int64 [1, T]; our outputs: "out" [1, T, H] before the final norm, "logits".
        """
        from eaglespec.spec.heads import load_head

        model = self.target.model
        head = load_head(self.head_dir, model, dtype=torch.float32)
        steps = []
        with torch.inference_mode():
            for p in self.prompts[:n_prompts]:
                ids = torch.tensor([p])
                n = ids.shape[1]
                cache = model.new_cache(1, n)
                out = model(ids, torch.arange(n)[None], cache, hidden_indices=head.hidden_indices)
                feats = head.target_feature(out)[:, :-1].float().contiguous()
                inputs = {"features": feats, "tokens": ids[:, 1:].contiguous(),
                          "positions": torch.arange(n - 1)[None].contiguous()}
                h = head(head.fuse(feats), inputs["tokens"], inputs["positions"], head.new_cache(1, n))
                steps.append(inputs | {"out": h.float(), "logits": head.logits(h).float()})
        state = {k: v.detach().float() if v.is_floating_point() else v for k, v in head.state_dict().items()}
        return state, steps


# ============================================================================================ comparisons
def compare_step(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> dict:
    """Max |difference| of the output feature and logits of one draft step, and top-1 agreement."""
    top_ours, top_theirs = ours["logits"].argmax(-1), theirs["logits"].to(ours["logits"]).argmax(-1)
    return {"out_max_diff": float((ours["out"] - theirs["out"].to(ours["out"])).abs().max()),
            "logits_max_diff": float((ours["logits"] - theirs["logits"].to(ours["logits"])).abs().max()),
            "top1_equal": int((top_ours == top_theirs).sum()), "positions": int(top_ours.numel())}


def compare_state(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor],
                  rename: dict[str, str] | None = None) -> dict:
    """Our head's tensors against a consumer's loaded state_dict (names mapped by ``rename`` prefixes):
    how many are bit-identical after casting to our dtype, and which differ or are absent there."""
    rename = rename or {}

    def theirs_name(name: str) -> str:
        return next((new + name[len(old):] for old, new in rename.items() if name.startswith(old)), name)

    equal, differ, absent = 0, [], []
    for name, t in ours.items():
        other = theirs.get(theirs_name(name))
        if other is None:
            absent.append(name)
        elif other.shape == t.shape and torch.equal(other.to(t.dtype), t):
            equal += 1
        else:
            differ.append(name)
    return {"tensors": len(ours), "identical": equal, "differ": differ, "absent": absent}


def compare_generation(vanilla: Sequence[Sequence[int]], ours: dict, theirs_outputs: Sequence[Sequence[int]],
                       theirs_per_pos: Sequence[int], theirs_rounds: int) -> dict:
    """Greedy agreement with our vanilla text and acceptance per position, theirs against ours."""
    equal = sum(list(a) == list(b) for a, b in zip(vanilla, theirs_outputs))
    per_pos = list(theirs_per_pos) + [0] * (len(ours["accepted_per_position"]) - len(theirs_per_pos))
    return {"greedy_equal_vanilla": equal, "prompts": len(vanilla),
            "ours_equal_vanilla": sum(list(a) == list(b) for a, b in zip(vanilla, ours["outputs"])),
            "accepted_per_position": {"ours": ours["accepted_per_position"], "theirs": per_pos},
            "rounds": {"ours": ours["rounds"], "theirs": theirs_rounds},
            "acceptance_equal": per_pos == ours["accepted_per_position"]}
