"""Keyed Aaronson-Gumbel text watermarking: the detector (standard library only) is exported here;
the sampler's device side is hashing.py and state.py. See docs/sampling.md."""

from sglang.srt.sampling.watermarking.detector import WatermarkDetection, WatermarkDetector, WatermarkStatistics, detect

__all__ = ["WatermarkDetection", "WatermarkDetector", "WatermarkStatistics", "detect"]
