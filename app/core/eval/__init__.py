"""Evaluation: rating and ranking metrics and the free baselines."""
