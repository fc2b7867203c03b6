"""What a fabric is (pure): the typed testbed spec, the topology model (fat-trees, leaf-spine,
rings, servers of GPUs and rails), congestion settings, and a fabric partitioned over machines.
Imports nothing that touches the system."""
