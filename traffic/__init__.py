"""What runs on a fabric: collective schedules, workloads (collectives, traces, NCCL logs,
training iterations, background patterns), NCCL-tests metrics, and the agents that carry them
over real sockets (:mod:`traffic.agents.runner`, :mod:`traffic.agents.agent`). Builds on :mod:`testbed`'s
model and fabric services; never on the experiment layer.
"""
