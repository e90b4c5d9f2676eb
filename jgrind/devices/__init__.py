"""Several devices: one exact full-graph model, data-parallel over the nodes (`Sharded`), or
the out-of-core engine with its partitions' steps spread over devices (`ShardedOutOfCore`)."""

from jgrind.devices.exchange import DeviceToDevice, ThroughHost
from jgrind.devices.executor import AXIS, Sharded, resolve_devices
from jgrind.devices.layout import DeviceData, DeviceShapes, device_data, device_shapes
from jgrind.devices.out_of_core import ShardedOutOfCore

__all__ = ["AXIS", "DeviceData", "DeviceShapes", "DeviceToDevice", "Sharded",
           "ShardedOutOfCore", "ThroughHost", "device_data", "device_shapes",
           "resolve_devices"]
