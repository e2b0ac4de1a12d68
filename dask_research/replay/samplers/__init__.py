"""Samplers: uniform, prioritized (vectorised sum-tree) and most-recent.

>>> sorted(BUILTIN)
['PrioritizedSampler', 'RecentSampler', 'UniformSampler']
"""
from .base import Sampler
from .prioritized import PrioritizedSampler
from .recent import RecentSampler
from .uniform import UniformSampler

__all__ = ["Sampler", "UniformSampler", "PrioritizedSampler", "RecentSampler", "BUILTIN"]

#: the samplers a checkpoint names by class that a restore rebuilds (``from_state``) unasked
BUILTIN: dict[str, type[Sampler]] = {c.__name__: c for c in (UniformSampler, PrioritizedSampler,
                                                             RecentSampler)}
