# The machine's services as fabriclab leaves them (sourced by scripts/setup.sh and
# scripts/lab-telemetry.sh; tests/unit/test_trust.py runs each function with stand-ins).

# Debian's prometheus package enables its own service, listening on every interface and used by
# nothing of fabriclab (each run starts its own Prometheus on loopback): stopped and disabled,
# unless the lab VM's standing configuration (scripts/lab-telemetry.sh enables it) owns it.
disable_unused_prometheus() {
  local systemd=${FABRICLAB_SYSTEMD_DIR:-/run/systemd/system}
  local config=${FABRICLAB_PROMETHEUS_CONFIG:-/etc/prometheus/prometheus.yml}
  [ -d "$systemd" ] || return 0
  systemctl is-enabled prometheus >/dev/null 2>&1 || return 0
  grep -q fabriclab "$config" 2>/dev/null && return 0
  echo "disabling Debian's own Prometheus service (unused; it listens on every interface)"
  systemctl disable --now prometheus >/dev/null 2>&1 || true
}

# Grafana's admin password for this machine: made once (random, 24 characters), kept in FILE
# readable by root only, printed. Never admin/admin.
grafana_admin_password() {
  local file=$1
  if [ ! -s "$file" ]; then
    install -d -m 0700 "$(dirname "$file")"
    (umask 077; head -c 18 /dev/urandom | base64 | tr '/+' '_-' > "$file")
  fi
  chmod 0600 "$file"
  cat "$file"
}
