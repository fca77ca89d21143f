"""Dynamic MIG: partitions published as counters, instances created by prepare."""
