"""What a workload is (pure): collective schedules (flat and hierarchical), training iterations,
background patterns, NCCL log imports, the experiment file's ``workload`` section, and the
runner <-> agent contract."""
