"""Host memory, disk and transfer plumbing beneath the planner and the engine: gathering and
scattering rows, buffer pools, host-device transfers and page-locked staging, checksums, free
space, memory limits, the allocator's settings and owner locks on run folders. It sits below
`jgrind.plan` because the planner measures the same operations the engine runs."""
