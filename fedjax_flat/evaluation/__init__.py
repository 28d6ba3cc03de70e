"""Evaluation (layer 5): the global test set, per-client and personalized models, corruptions, retrieval
and routed (per-cluster) models, each as jit-compiled passes over padded batches with additive metrics.
"""
