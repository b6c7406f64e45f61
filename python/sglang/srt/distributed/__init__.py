"""Tensor parallelism over torch.distributed: process groups, the collectives the scheduler uses,
and which TP sizes a model can be split by."""
