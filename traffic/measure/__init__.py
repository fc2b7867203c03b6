"""What is measured and how it is defined (pure): NCCL-tests metrics (algbw, busbw), per-collective
results, what a schedule's bytes predict at line rate, probe outages, transport goodput."""
