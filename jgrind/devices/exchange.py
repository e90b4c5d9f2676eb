"""How halo rows travel between devices: a value passed to the executors, one per layer.

* `DeviceToDevice`: the rows a device reads from another device's partitions go straight
  between the devices: by a collective in `jgrind.devices.Sharded` (one ``all_to_all``
  before the layer, its transpose in the backward pass), by `jax.device_put` to the reading
  step's device in `jgrind.devices.ShardedOutOfCore` (for a layer whose input blocks have
  the device fate, `jgrind.devices.placed_tier`). The layer's rows stay on the devices.
* `ThroughHost`: the rows of the layer's input go to host memory (stored there, or on
  through it to the SSD, or read there from the device tier), and a device reads the halo
  rows it needs from there (`jgrind.devices.ShardedOutOfCore`): FlexGNN's G2H. The halo
  input gradients go back the same way and are added where their owner's rows are.

`jgrind.plan.sharded.choose_exchanges` picks one per layer under the budgets; `Sharded` runs
the first for every layer, `ShardedOutOfCore` either, layer by layer.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

# defined beside the planner that chooses them (`jgrind.plan` is below `jgrind.devices`)
from jgrind.plan.sharded import DeviceToDevice, ThroughHost

__all__ = ["DeviceToDevice", "Exchange", "ThroughHost", "one_route", "per_layer"]


Exchange = Union[DeviceToDevice, ThroughHost]


def per_layer(exchange: Optional[Union[Exchange, Sequence[Optional[Exchange]]]],
              num_layers: int, default: Exchange) -> tuple:
    """``exchange`` as one value per layer: one value for every layer, a sequence of
    ``num_layers`` (None: ``default``), or None: ``default`` everywhere."""
    if exchange is None:
        return (default,) * num_layers
    if isinstance(exchange, (DeviceToDevice, ThroughHost)):
        return (exchange,) * num_layers
    try:
        chosen = tuple(exchange)
    except TypeError:
        raise TypeError(f"exchange must be DeviceToDevice(), ThroughHost() or one of them per "
                        f"layer, got {exchange!r}") from None
    if len(chosen) != num_layers:
        raise ValueError(f"exchange names {len(chosen)} layers; the model has {num_layers}")
    bad = [e for e in chosen if e is not None and not isinstance(e, (DeviceToDevice,
                                                                      ThroughHost))]
    if bad:
        raise TypeError(f"exchange must hold DeviceToDevice() or ThroughHost() values, got "
                        f"{bad[0]!r}")
    return tuple(default if e is None else e for e in chosen)


def one_route(exchange, num_layers: int, route: Exchange, executor: str,
              other: str) -> tuple:
    """`per_layer` for an executor that runs ``route`` only (``executor``, named in the
    refusal); any layer naming the other route is refused, pointing to ``other``, which runs
    that one."""
    chosen = per_layer(exchange, num_layers, route)
    if any(type(e) is not type(route) for e in chosen):
        other_route = ThroughHost() if isinstance(route, DeviceToDevice) else DeviceToDevice()
        raise ValueError(f"{executor} exchanges halo rows {route}; {[str(e) for e in chosen]} "
                         f"names another route: {other} exchanges them {other_route}")
    return chosen
