"""Partitioning: assign nodes to partitions, build per-partition halos and local CSRs, and
report partition quality.

    from jgrind.partition import PARTITIONERS, partition_graph, measure, quality
    m = measure("label_propagation", graph, 64, seed=0)
    pg = partition_graph(graph, m.assignment, num_parts=64)
    print(quality(pg, m).format())
"""

from jgrind.partition.partitioned import (BUCKET_MIN, Partition, PartitionedGraph, bucket,
                                          partition_graph, shape_groups)
from jgrind.partition.partitioners import (PARTITIONERS, check_num_parts, contiguous,
                                           label_propagation, metis, neighbour_csr, random)
from jgrind.partition.quality import Measurement, PartitionQuality, measure, quality

__all__ = [
    "BUCKET_MIN", "Partition", "PartitionedGraph", "bucket", "partition_graph", "shape_groups", "PARTITIONERS", "check_num_parts", "contiguous", "label_propagation",
    "metis", "neighbour_csr", "random", "Measurement", "PartitionQuality", "measure", "quality",
]
