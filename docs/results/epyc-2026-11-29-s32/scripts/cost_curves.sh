#!/usr/bin/env bash
# Issue 13's cost curve at batch 1, measured again and again: ROUNDS runs of `eaglespec bench --cost-curve` (each a
# fresh process: N = 1, 2, 4, 8 timed in rounds of one forward each, the median of REPEATS rounds), alternating the
# 128- and 256-token prefixes, SLEEP seconds apart; prints verify(N) / verify(1) of every run.
#   bash cost_curves.sh OUT [ROUNDS=6] [REPEATS=100] [SLEEP=20]
set -euo pipefail
OUT=$1; ROUNDS=${2:-6}; REPEATS=${3:-100}; SLEEP=${4:-20}
E=${EAGLESPEC:-eaglespec}
for i in $(seq "$ROUNDS"); do
    for prefix in 128 256; do
        "$E" bench --cost-curve --cost-tokens 1,2,4,8 --cost-batch-sizes 1 --cost-repeats "$REPEATS" \
            --cost-prefix "$prefix" --threads 2 --no-report --out "$OUT/p$prefix-$i" > "$OUT/p$prefix-$i.log" 2>&1
        python - "$OUT/p$prefix-$i/cost_curve.jsonl" "$prefix" "$i" <<'PY'
import json, sys
pts = {r["n_tokens"]: r for r in map(json.loads, open(sys.argv[1]))}
print(f"run {sys.argv[3]} prefix {sys.argv[2]}: verify(1) {1e3 * pts[1]['median_s']:.2f} ms; "
      + ", ".join(f"verify({n}) / verify(1) {pts[n]['relative']:.2f}" for n in (2, 4, 8)))
PY
        sleep "$SLEEP"
    done
done
