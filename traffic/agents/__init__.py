"""What carries a workload over real sockets: the runner (one agent per rank host), the agent and
its UDP engine, iperf3, numbered UDP flows and the failure probe stream."""
