"""Device policy: where and how each model role runs on this worker (see policy.py, detect.py)."""

from workers.device.policy import DevicePolicy, Placement

__all__ = ["DevicePolicy", "Placement"]
