"""The store's tiers: one class per place a table's blocks can live.

`Tier` is the interface (`protocol`); `DeviceTier`, `HostTier`, `TransientTier` (a recomputed
layer's rows) and `SSDTier` (with the host cache in front) are the production tiers, and
`naive` holds the comparison scheme's (`RowReadsSSDTier`, `Snapshot`). A `Table`
(`jgrind.engine.store`) routes rows between them; the store says which class serves which fate
(`jgrind.engine.store.TIERS`).
"""

from jgrind.engine.tiers.cached_ssd import WHOLE_FILE, SSDTier
from jgrind.engine.tiers.device import DeviceRows, DeviceTier
from jgrind.engine.tiers.host import HostTier, TransientTier
from jgrind.engine.tiers.naive import RowReadsSSDTier, Snapshot
from jgrind.engine.tiers.protocol import (NOTHING_HELD, BlockTier, Shared, Tier, TierBlocks,
                                          padded_buffer)

__all__ = ["NOTHING_HELD", "BlockTier", "DeviceRows", "DeviceTier", "HostTier", "RowReadsSSDTier", "SSDTier",
           "Shared", "Snapshot", "Tier", "TierBlocks", "TransientTier", "WHOLE_FILE",
           "padded_buffer"]
