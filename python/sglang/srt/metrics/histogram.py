"""A histogram kept where prometheus_client is not (the scheduler); /metrics exports its snapshot."""

from __future__ import annotations

import bisect

# Step times: a CPU decode step of the embedded model is ~10-50 ms, a GPU one ~5-30 ms, a long
# prefill seconds.
STEP_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = STEP_TIME_BUCKETS) -> None:
        self.buckets = list(buckets)
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def cumulative(self) -> list[int]:
        """Counts of observations <= each bucket bound, then the total (Prometheus' le buckets)."""
        out, total = [], 0
        for count in self.counts:
            total += count
            out.append(total)
        return out
