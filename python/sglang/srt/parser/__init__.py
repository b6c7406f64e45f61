"""Parsers of model output text: the reasoning (think) section (`--reasoning-parser`)."""
