"""The step-cost feedback's state after each request of `--tree auto` in a bench run, for one batch size and
temperature: per request its tree rounds, predicted and measured speedup, and each (tree, band) reading
(ratio / weight -> factor) from the record's ``cost_feedback``.

    python feedback_by_request.py RECORDS.jsonl [--batch 1] [--temperature 0]
"""
import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0)
    a = ap.parse_args()
    with open(a.records) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    auto = [r for r in recs if r["method"].endswith("auto") and r["batch_size"] == a.batch
            and r["temperature"] == a.temperature]
    if not auto:
        raise SystemExit(f"no --tree auto records at batch {a.batch}, T={a.temperature} in {a.records}")
    for r in auto:
        cf = [c for c in r.get("cost_feedback", []) if c["batch"] == a.batch]
        readings = " ".join(f"{c['tree']}@{c['context'][0] if c['context'] else '-'}:{c['ratio']:.2f}/"
                            f"{c['weight']:.0f}->{c['factor']:.2f}" for c in cf)
        print(f"{r['question_id']:>6} prompt {r['prompt_tokens']:>4} rounds {r['tree_rounds']} predicted "
              f"{r['predicted_speedup']} measured {r['measured_speedup']} | {readings}")


if __name__ == "__main__":
    main()
