#!/usr/bin/env bash
# Step-cost feedback on and off in one bench run: `--tree auto` (feedback on, the default) against
# `eagle:auto,feedback=off` and vanilla, Spec-Bench first turns (2 a category, 26 prompts), 128 tokens (--ignore-eos),
# greedy, 2 threads.
#   bash feedback_ab.sh OUT BATCHES [FAULT]
# METHODS (environment) replaces the methods, e.g. "vanilla,eagle:auto,feedback=off,eagle:auto" to swap the arms'
# order within each group (bench runs the methods of a group in the order given, reversed every other group);
# TEMPS the temperatures (default 0); MT=1 runs MT-bench first turns (3 a category, 24) instead of Spec-Bench.
# FAULT (any value): run on a copy of the cache directory whose calibration prices the batch-4 chain of 1 at 1.25
# plain steps (the machine's own calibration read ~1.52): a calibration that errs, as one did in session 20.
set -euo pipefail
OUT=$1; BATCHES=$2; FAULT=${3:-}
E=${EAGLESPEC:-.venv/bin/eaglespec}; D=${D:-../shared/data}
if [ -n "$FAULT" ]; then
    SRC=${EAGLESPEC_CACHE_DIR:-$HOME/.cache/eaglespec}; F=$OUT/cache
    rm -rf "$F"; mkdir -p "$F"
    for d in models kernels interop; do ln -s "$SRC/$d" "$F/$d"; done
    cp -r "$SRC/plans" "$SRC/calibration" "$F/"
    python3 - "$F/calibration" <<'PY'
import json, sys
from pathlib import Path
for p in Path(sys.argv[1]).glob("*.json"):
    d = json.loads(p.read_text())
    v = {(b, n): s for b, n, s in d["verify"]}
    o = dict((b, s) for b, s in d["overhead"])
    for e in d["draft"]:
        if e[0] == 4 and e[1] == "chain1":
            new = 1.25 * (v[(4, 1)] + o[4]) - v[(4, 2)] - o[4]
            print(f"{p.name}: draft(4, chain1) {e[2] * 1e3:.2f} -> {new * 1e3:.2f} ms")
            e[2] = new
    p.write_text(json.dumps(d))
PY
    export EAGLESPEC_CACHE_DIR=$F
fi
DS=(--dataset "spec_bench=$D/spec_bench/question.jsonl" --limit-per-category 2)
[ -n "${MT:-}" ] && DS=(--dataset "mt_bench=$D/mt_bench/question.jsonl" --limit-per-category 3)
"$E" bench "${DS[@]}" --max-turns 1 --ignore-eos \
    --max-new-tokens 128 --threads 2 --seed 0 --batch-size "$BATCHES" --temperature "${TEMPS:-0}" \
    --methods "${METHODS:-vanilla,eagle:auto,eagle:auto,feedback=off}" --out "$OUT/bench"
