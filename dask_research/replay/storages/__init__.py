"""Storages: where transition records live (host, device, disk) and tiers that compose them."""
from .base import Storage
from .device import DeviceStorage
from .disk import DiskStorage
from .host import HostStorage
from .tiered import DeviceTier, DiskTier, HostTier, Tier, TieredStorage

__all__ = ["Storage", "HostStorage", "DeviceStorage", "DiskStorage", "TieredStorage",
           "Tier", "HostTier", "DeviceTier", "DiskTier"]
