"""Several devices: one exact full-graph model, data-parallel over the nodes (`Sharded`)."""

from jgrind.devices.executor import AXIS, Sharded, resolve_devices
from jgrind.devices.layout import DeviceData, DeviceShapes, device_data, device_shapes

__all__ = ["AXIS", "DeviceData", "DeviceShapes", "Sharded", "device_data", "device_shapes",
           "resolve_devices"]
