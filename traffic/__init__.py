"""What runs on a fabric: workloads (:mod:`.workloads`: collective schedules, traces, NCCL logs,
training iterations, background patterns), what they measure (:mod:`.measure`: NCCL-tests
metrics, results), reliable transports as sans-I/O state machines (:mod:`.transports`), and the
agents that carry it all over real sockets (:mod:`.agents`). Builds on :mod:`testbed`'s model
and its running fabric; never on the experiment layer.
"""
