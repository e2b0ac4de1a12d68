"""Samplers: uniform, prioritized (vectorised sum-tree) and most-recent."""
from .base import Sampler
from .prioritized import PrioritizedSampler
from .recent import RecentSampler
from .uniform import UniformSampler

__all__ = ["Sampler", "UniformSampler", "PrioritizedSampler", "RecentSampler"]
