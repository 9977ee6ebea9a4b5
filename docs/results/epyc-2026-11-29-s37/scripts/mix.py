# auto's decode step (vanilla steps) against the mix of the fixed chains' steps in the same group, by request
# python mix.py RECORDS.jsonl...   (batch 1, T=0 records of a bench run with vanilla, auto and the fixed chains)
import json, sys
for path in sys.argv[1:]:
    rows = [json.loads(l) for l in open(path)]
    rows = [r for r in rows if r['batch_size'] == 1 and r['temperature'] == 0]
    by = {}
    for r in rows: by.setdefault(r['question_id'], {})[r['method']] = r
    tot = [0, 0]
    for q, d in by.items():
        v = d['vanilla']; vs = (v['wall_s'] - v['prefill_s']) / v['target_forwards']
        st = {m: (d[m]['wall_s'] - d[m]['prefill_s']) / d[m]['target_forwards'] / vs for m in d}
        a = d['eagle:auto']; rounds = a['tree_rounds']
        drafted = {k: n for k, n in rounds.items() if k != 'none'}
        mix = sum(n * st.get('eagle:' + k, float('nan')) for k, n in rounds.items() if k != 'none') + rounds.get('none', 0) * 1.0
        mix /= sum(rounds.values())
        if len(drafted) >= 1 and all('eagle:' + k in st for k in drafted):
            print(f"{q:12s} rounds {rounds}  auto {st['eagle:auto']:.2f}  mix of fixed {mix:.2f}  ratio {st['eagle:auto']/mix:.3f}")
