"""What is measured and how it is defined (pure): NCCL-tests metrics (algbw, busbw), per-collective
results, probe outages, transport goodput. What a workload should take is
:mod:`traffic.predict`'s."""
