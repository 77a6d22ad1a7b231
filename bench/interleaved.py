"""Timing variants of one step in one process, round by round, so that the machine's drift
between minutes falls on every variant alike (bench_python.py, bench_llama.py)."""
from typing import Dict, List


def interleaved(variants: dict, rounds: int, steps: int) -> Dict[str, List[float]]:
    """Per variant (an object with step() -> milliseconds), the best of `steps` steps in each
    of `rounds` rounds; a first round warms up and is not kept."""
    times: Dict[str, List[float]] = {k: [] for k in variants}
    for r in range(rounds + 1):
        for k, v in variants.items():
            ms = min(v.step() for _ in range(steps))
            if r:
                times[k].append(ms)
    return times
