"""Beam search: the selection math (selection.py), the per-request search state (group.py) and
the carrier of finished beams (types.py). The scheduler wiring is managers/beam_coordinator.py."""
