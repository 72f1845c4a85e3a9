"""BLR (SmallDB) timing: an 8-element domain with 5 counting queries, and oversize refusal.

Goals (issue 6): a domain of 8 elements with 5 counting queries runs in under a second;
a domain too large to enumerate is refused with a typed error in well under a second.
Prints the wall time of construction + one release for several synthetic sizes m, and of
refusing oversize configurations.

Run: python benchmarks/bench_blr.py
"""

from __future__ import annotations

import time

from dpaccount.errors import ConfigError
from dpaccount.mechanisms.blr import BLRMechanism

QUERIES = [lambda x, t=t: x < t for t in (2, 4, 6)] + [
    lambda x: x % 2 == 0,
    lambda x: x in (1, 5),
]
DATA = [x for x in range(8) for _ in range(120)] + [0] * 40


def main() -> None:
    print(f"{'m':>3} {'epsilon':>7} {'candidates':>10} {'seconds':>8}  synthetic")
    for m in (5, 8, 10, 12):
        for eps in (0.1, 1.0, 10.0):
            start = time.perf_counter()
            mech = BLRMechanism(eps, range(8), QUERIES, size=m, dataset_size=len(DATA))
            synthetic = mech.release(DATA)
            took = time.perf_counter() - start
            flag = "" if took < 1.0 else "  OVER 1 s"
            print(f"{m:3} {eps:7} {mech.candidate_count:10} {took:8.3f}  {synthetic}{flag}")
    print("\noversize refusal (ConfigError before enumerating):")
    for domain, m in ((10**6, 1000), (2**64, 10), (64, 64)):
        start = time.perf_counter()
        try:
            BLRMechanism(1, range(domain), [[1] * 4], size=m, dataset_size=100)
        except ConfigError:
            took = time.perf_counter() - start
            print(f"  |X| = {domain}, m = {m}: refused in {took * 1e3:.3f} ms")
        else:  # pragma: no cover - would be a bug
            print(f"  |X| = {domain}, m = {m}: NOT refused")


if __name__ == "__main__":
    main()
