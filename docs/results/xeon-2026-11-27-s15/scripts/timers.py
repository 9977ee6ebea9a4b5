# Wall-time accumulators for the session's "where does a step go" scripts: wrap(obj, name, label) replaces a
# method by one that adds its perf_counter time to acc[label] and counts the call in cnt[label].
import collections
import time

acc = collections.defaultdict(float)
cnt = collections.Counter()


def wrap(obj, name, label):
    f = getattr(obj, name)

    def timed(*a, **k):
        t0 = time.perf_counter()
        r = f(*a, **k)
        acc[label] += time.perf_counter() - t0
        cnt[label] += 1
        return r

    setattr(obj, name, timed)
