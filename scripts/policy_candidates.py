#!/usr/bin/env python3
"""Prototype replays of expert-cache eviction policies on a route_trace v1 file.

The exploration behind docs/policy.md: each candidate replays the trace with the rules of
`sluice analyze replay` (layer batches; one lookup per distinct expert; eviction after the
batch, never an entry the batch touched; decode-only hit %). `lru` ranks by first appearances
only (the Rust replay also counts a repeat within a prefill batch as a use; the two differ by at
most 0.013 points, docs/replay.md), and `forecast` reproduces the policy the engine ships
(store::policy::Forecast) to every decimal `sluice analyze replay --policy default` prints.

    python3 scripts/policy_candidates.py crates/telemetry/tests/data/qwen3-30b-a3b.route.csv

Needs numpy. Prints one row per candidate: decode hit % at each budget, then two bounds that
peek at the future (not policies: no online policy has their information), which tell how far
eviction can get on what a routing history can know:

- `oracle-freq`: every expert's true frequency over the rest of the trace, ranked as forecast
  ranks its estimate (expected layer visits to the next use); `+recency` also keeps forecast's
  floor for an expert used at its layer's last visit.
- `oracle-next-token`: the exact set each layer routes at its next visit (a perfect predictor of
  the next token's routing); beyond that, forecast's estimate. `both-oracles` combines the two.
"""
import sys
import numpy as np


def load(path):
    layer_bytes, rows = {}, []
    n_layer = n_expert = k = None
    for line in open(path):
        if line.startswith('# model='):
            kv = dict(p.split('=', 1) for p in line[2:].split() if '=' in p)
            n_layer, n_expert, k = int(kv['n_layer']), int(kv['n_expert']), int(kv['n_expert_used'])
        elif line.startswith('# layer='):
            kv = dict(p.split('=') for p in line[2:].split())
            layer_bytes[int(kv['layer'])] = int(kv['expert_bytes'])
        elif line.startswith('#') or line.startswith('turn'):
            continue
        else:
            t = line.strip().split(',')
            rows.append((int(t[0]), int(t[1]), int(t[2]), int(t[3]), int(t[5])))
    batches, cur = [], None
    for (turn, phase, step, layer, e) in rows:
        key = (turn, phase, layer, step if phase == 1 else None)
        if key != cur:
            cur = key
            batches.append((phase, layer, []))
        if e not in batches[-1][2]:
            batches[-1][2].append(e)
    return batches, layer_bytes, n_layer, n_expert, k


class State:
    """What every candidate may use: counts, visits, the last visit of each key, and the
    routed set of the current token's previous layer with online co-activation counts."""

    def __init__(self, nl, ne):
        self.count = np.zeros((nl, ne))
        self.visits = np.zeros(nl, np.int64)
        self.lastv = -np.ones((nl, ne), np.int64)
        self.bits = np.zeros((nl, ne), np.int64)
        self.ema = None
        self.tick = np.zeros((nl, ne), np.int64)
        self.co = np.zeros((nl, ne, ne))
        self.prev = None


def replay(batches, layer_bytes, nl, ne, k, cap_mib, rank, learn=None):
    cap = cap_mib << 20
    st = State(nl, ne)
    resident = np.zeros((nl, ne), bool)
    touched = -np.ones((nl, ne), np.int64)
    used = hits = looks = tick = 0
    for bi, (phase, layer, experts) in enumerate(batches):
        st.visits[layer] += 1
        if learn:
            learn(st, layer, experts, phase)
        for e in experts:
            if phase == 1:
                looks += 1
            if resident[layer, e]:
                hits += phase == 1
            else:
                resident[layer, e] = True
                used += layer_bytes[layer]
            touched[layer, e] = bi
            st.count[layer, e] += 1
            st.lastv[layer, e] = st.visits[layer]
            tick += 1
            st.tick[layer, e] = tick
        routed = np.zeros(ne, np.int64)
        routed[experts] = 1
        st.bits[layer] = ((st.bits[layer] << 1) | routed) & 7
        if phase == 1 and st.prev is not None and layer > 0:
            st.co[layer][np.ix_(st.prev, experts)] += 1
        st.prev = np.array(experts)
        if used > cap:
            ls, es = np.nonzero(resident & (touched != bi))
            d = (ls - layer - 1) % nl
            keep = rank(st, ls, es, d, nl, ne, k, layer, experts)  # higher = kept longer
            for i in np.lexsort((es, ls, keep)):
                if used <= cap:
                    break
                resident[ls[i], es[i]] = False
                used -= layer_bytes[ls[i]]
    return 100.0 * hits / max(looks, 1)


def wait(p, d, nl):
    return d + nl * (1.0 / np.clip(p, 1e-9, 1.0) - 1.0)


def freq(st, ls, es, k, ne):
    return (st.count[ls, es] + k / ne) / (st.visits[ls] + 1.0)


def r_lru(st, ls, es, d, nl, ne, k, layer, ex):
    return st.tick[ls, es].astype(float)


def r_lfu(st, ls, es, d, nl, ne, k, layer, ex):
    return st.count[ls, es] * 1e9 + st.tick[ls, es]


def r_forecast(st, ls, es, d, nl, ne, k, layer, ex):
    f = freq(st, ls, es, k, ne)
    p = np.where(st.lastv[ls, es] == st.visits[ls], np.maximum(f, 0.5), f)
    return -wait(p, d, nl)


def ema_learn(st, layer, experts, phase):
    if st.ema is None:
        st.ema = np.full(st.count.shape, 6 / st.count.shape[1])
    routed = np.zeros(st.count.shape[1])
    routed[experts] = 1
    st.ema[layer] = 0.9 * st.ema[layer] + 0.1 * routed


def r_ema(st, ls, es, d, nl, ne, k, layer, ex):
    return -wait(st.ema[ls, es], d, nl)


TABLE = {}


def table_learn(st, layer, experts, phase):
    n, h = TABLE.setdefault('n', np.zeros((8, 5))), TABLE.setdefault('h', np.zeros((8, 5)))
    if phase != 1:
        return
    fb = np.minimum((st.count[layer] / np.maximum(st.visits[layer] - 1, 1) / 0.5 * 5).astype(int), 4)
    routed = np.zeros(st.count.shape[1])
    routed[experts] = 1
    np.add.at(n, (st.bits[layer], fb), 1)
    np.add.at(h, (st.bits[layer], fb), routed)


def r_table(st, ls, es, d, nl, ne, k, layer, ex):
    fb = np.minimum((st.count[ls, es] / np.maximum(st.visits[ls], 1) / 0.5 * 5).astype(int), 4)
    b = st.bits[ls, es]
    p = (TABLE['h'][b, fb] + 2 * freq(st, ls, es, k, ne)) / (TABLE['n'][b, fb] + 2)
    return -wait(p, d, nl)


def r_coact(st, ls, es, d, nl, ne, k, layer, ex):
    keep = r_forecast(st, ls, es, d, nl, ne, k, layer, ex)
    nxt = layer + 1
    if nxt < nl:
        m = ls == nxt
        trans = st.co[nxt][ex] / (np.maximum(st.count[layer, ex], 1)[:, None] + 1)
        pc = np.clip(trans.sum(0)[es[m]], 0, 1)
        f = freq(st, ls[m], es[m], k, ne)
        p = np.maximum(np.where(st.lastv[ls[m], es[m]] == st.visits[ls[m]], np.maximum(f, 0.5), f), pc)
        keep[m] = -wait(p, d[m], nl)
    return keep


CANDIDATES = [
    ('lru', r_lru, None),
    ('lfu', r_lfu, None),
    ('forecast', r_forecast, None),
    ('ema-0.9', r_ema, ema_learn),
    ('learned-table', r_table, table_learn),
    ('forecast+coact', r_coact, None),
]

class Oracle:
    """What the bounds peek at: each expert's total count and each layer's total visits, and
    for every batch the set each layer routes at its next visit after it."""

    def __init__(self, batches, nl, ne):
        self.total = np.zeros((nl, ne))
        self.tvis = np.zeros(nl)
        for (_, layer, ex) in batches:
            self.tvis[layer] += 1
            self.total[layer, ex] += 1
        self.next_sets = [None] * len(batches)
        last = [None] * nl
        for bi in range(len(batches) - 1, -1, -1):
            self.next_sets[bi] = list(last)
            last[batches[bi][1]] = set(batches[bi][2])
        self.bi = 0

    def learn(self, st, layer, experts, phase):
        self.bi += 1

    def p_future(self, st, ls, es):
        rem = self.total[ls, es] - st.count[ls, es]
        return np.clip(rem / np.maximum(self.tvis[ls] - st.visits[ls], 1), 1e-9, 1.0)

    def in_next(self, ls, es):
        sets = self.next_sets[self.bi - 1]
        return np.array([sets[l] is not None and e in sets[l] for l, e in zip(ls, es)], bool)


def oracle_bounds(o):
    def freq_(st, ls, es, d, nl, ne, k, layer, ex):
        return -wait(o.p_future(st, ls, es), d, nl)

    def freq_rec(st, ls, es, d, nl, ne, k, layer, ex):
        p = o.p_future(st, ls, es)
        p = np.where(st.lastv[ls, es] == st.visits[ls], np.maximum(p, 0.5), p)
        return -wait(p, d, nl)

    def next_tok(st, ls, es, d, nl, ne, k, layer, ex):
        f = freq(st, ls, es, k, ne)
        p = np.where(st.lastv[ls, es] == st.visits[ls], np.maximum(f, 0.5), f)
        return -np.where(o.in_next(ls, es), d, d + nl / np.clip(p, 1e-9, 1.0))

    def both(st, ls, es, d, nl, ne, k, layer, ex):
        return -np.where(o.in_next(ls, es), d, d + nl / o.p_future(st, ls, es))

    return [
        ('oracle-freq', freq_),
        ('oracle-freq+recency', freq_rec),
        ('oracle-next-token', next_tok),
        ('both-oracles', both),
    ]


if __name__ == '__main__':
    path = sys.argv[1]
    budgets = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else '500,1000,2000,4000').split(',')]
    batches, lb, nl, ne, k = load(path)
    print('candidate       ' + ' '.join(f'{b:>8}' for b in budgets))
    for name, rank, learn in CANDIDATES:
        TABLE.clear()
        row = []
        for b in budgets:
            TABLE.clear()
            row.append(replay(batches, lb, nl, ne, k, b, rank, learn))
        print(f'{name:<15} ' + ' '.join(f'{h:8.3f}' for h in row), flush=True)
    print('# bounds that peek at the future (not policies)')
    o = Oracle(batches, nl, ne)
    for name, rank in oracle_bounds(o):
        row = []
        for b in budgets:
            o.bi = 0
            row.append(replay(batches, lb, nl, ne, k, b, rank, o.learn))
        print(f'{name:<19} ' + ' '.join(f'{h:8.3f}' for h in row), flush=True)
