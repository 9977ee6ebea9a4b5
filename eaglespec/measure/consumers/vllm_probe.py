"""vLLM probe: serve the target with our head as vLLM's speculator and report tokens and acceptance.

Usage (inside the vLLM venv): python vllm_probe.py REQUEST.json RESULT.json

REQUEST: {"target_dir", "head_dir" (null = no speculation), "method" ("eagle3" | "eagle"),
          "num_speculative_tokens", "prompts" (token id lists), "max_new_tokens", "dtype", "threads"}
RESULT:  {"vllm_version", "outputs": [token id lists], "drafts", "accepted_per_position",
          "wall_s", "new_tokens"}

Greedy (temperature 0) with ignore_eos, prompts given as token ids (our chat template already applied), so
the only thing that differs from our engine is the engine itself.

Serving mode for `eaglespec bench` (one engine kept alive for a whole benchmark):
    python vllm_probe.py --serve CONFIG.json
CONFIG as REQUEST without prompts/max_new_tokens, plus "max_num_seqs". It answers on stdout, one JSON line
each: first {"ready": true, "vllm_version"}, then for every request line on stdin {"prompts", "max_new_tokens",
"ignore_eos", "temperature", "top_p", "seeds"} one line {"outputs", "finish_reasons", "wall_s", "drafts",
"accepted_per_position"} (the counters' increase during that request). Everything else vLLM prints goes to
stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time


def build(req: dict):
    """The vLLM engine: the target, and our head as its speculator when "head_dir" is given."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["OMP_NUM_THREADS"] = str(req.get("threads", 1))
    import torch
    from vllm import LLM

    torch.set_num_threads(int(req.get("threads", 1)))
    spec = None
    if req.get("head_dir"):
        spec = {"method": req["method"], "model": req["head_dir"],
                "num_speculative_tokens": int(req["num_speculative_tokens"])}
    return LLM(model=req["target_dir"], tokenizer=req["target_dir"], dtype=req.get("dtype", "float32"),
               speculative_config=spec, max_model_len=int(req.get("max_model_len", 2048)), seed=0,
               disable_log_stats=False, max_num_seqs=int(req.get("max_num_seqs", 256)))


def serve(config_path: str) -> int:
    proto = os.fdopen(os.dup(1), "w")  # the protocol keeps the real stdout ...
    os.dup2(2, 1)  # ... and everything else printed (vLLM's logs, its engine process) goes to stderr
    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = build(json.loads(open(config_path).read()))
    proto.write(json.dumps({"ready": True, "vllm_version": vllm.__version__}) + "\n")
    proto.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        r = json.loads(line)
        params = [SamplingParams(temperature=float(r.get("temperature", 0.0)), top_p=float(r.get("top_p", 1.0)),
                                 max_tokens=int(r["max_new_tokens"]), ignore_eos=bool(r.get("ignore_eos")),
                                 seed=seed) for seed in r["seeds"]]
        before = _spec_metrics(llm)
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in r["prompts"]], params, use_tqdm=False)
        wall = time.perf_counter() - t0
        after = _spec_metrics(llm)
        proto.write(json.dumps({
            "outputs": [list(o.outputs[0].token_ids) for o in outs],
            "finish_reasons": [o.outputs[0].finish_reason for o in outs], "wall_s": wall,
            "drafts": after["drafts"] - before["drafts"],
            "accepted_per_position": [a - b for a, b in zip(after["per_pos"], before["per_pos"] + [0] * 64)],
        }) + "\n")
        proto.flush()
    return 0


def main(request_path: str, result_path: str) -> int:
    if request_path == "--serve":
        return serve(result_path)
    req = json.loads(open(request_path).read())
    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = build(req)
    params = SamplingParams(temperature=0.0, max_tokens=int(req["max_new_tokens"]), ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in req["prompts"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    before = _spec_metrics(llm)
    outputs = []
    t0 = time.perf_counter()
    if req.get("batch", 1) == 1:
        for p in prompts:
            outputs += llm.generate([p], params, use_tqdm=False)
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    after = _spec_metrics(llm)
    per_pos = [a - b for a, b in zip(after["per_pos"], before["per_pos"] + [0] * len(after["per_pos"]))]
    result = {
        "vllm_version": vllm.__version__,
        "outputs": [list(o.outputs[0].token_ids) for o in outputs],
        "drafts": after["drafts"] - before["drafts"],
        "accepted_per_position": per_pos,
        "wall_s": wall,
        "new_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
    }
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


def _spec_metrics(llm) -> dict:
    """Totals of vLLM's speculative-decoding counters (drafting rounds, accepted tokens per position)."""
    drafts, per_pos = 0, []
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            drafts += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per_pos = [int(v) for v in m.values]
    return {"drafts": drafts, "per_pos": per_pos}


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
