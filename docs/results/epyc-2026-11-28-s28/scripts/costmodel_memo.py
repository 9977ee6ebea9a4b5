# The cost table's lookups before and after they remember their answers (session 28), in one process: BASE's
# spec/costmodel.py (git show) loaded next to the current one, both over this machine's newest cached
# calibration; the best of 5 timings of 20000 rounds of the lookups a paused step makes (two verify costs at a
# context, the paused and a draft cost), and the prices, which must be equal.   python costmodel_memo.py
import glob, importlib.util, json, os, subprocess, sys, tempfile, timeit
from pathlib import Path

from eaglespec.engine.calibrate import _from_json
from eaglespec.runtime.loading import cache_root

BASE = "e079b43"  # main before session 28
ROOT = Path(__file__).resolve().parents[4]
src = subprocess.run(["git", "-C", str(ROOT), "show", f"{BASE}:eaglespec/spec/costmodel.py"], check=True,
                     capture_output=True, text=True).stdout
path = Path(tempfile.mkdtemp()) / "costmodel_base.py"
path.write_text(src)
spec = importlib.util.spec_from_file_location("costmodel_base", path)
base = importlib.util.module_from_spec(spec)
sys.modules["costmodel_base"] = base
spec.loader.exec_module(base)
newest = max(glob.glob(str(cache_root() / "calibration" / "*.json")), key=os.path.getmtime)
data = json.load(open(newest))
now = _from_json(data.get("table", data))
before = base.CostTable(now.verify, now.draft, now.fingerprint, now.overhead, now.paused, now.context, now.prefix,
                        now.sampled_overhead, now.sampled_draft)
for name, t in (("before", before), ("after", now)):
    look = lambda: (t.verify_cost(1, 1, 230.0), t.verify_cost(1, 2, 230.0), t.paused_cost(1), t.draft_cost(1, "chain1"))
    us = min(timeit.repeat(look, number=20000, repeat=5)) / 20000 * 1e6
    print(f"{name}: {us:.2f} us a round; prices {look()}")
