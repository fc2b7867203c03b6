"""The controller's logic (pure): per-switch forwarding tables from the topology and live link
state (ECMP, D-mod-k, spraying), adaptive load-aware placement, and the session state of each
switch. Returns operations; never sends them."""
