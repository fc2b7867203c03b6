"""What to do to a fabric (pure): each link end's tc plan, the ECN marker's thresholds, the PFC
pause state machine, failure plans, the fidelity model (a machine's forwarding budget) and the
all-pairs reachability probe. Derived from :mod:`testbed.model`; imports nothing that touches
the system."""
