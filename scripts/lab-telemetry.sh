#!/usr/bin/env bash
# The lab VM's telemetry, provisioned after scripts/setup.sh (the Vagrantfile runs both):
#   - Prometheus (Debian's package, its systemd service on 9090) scraping whichever fabric is up:
#     every run announces its exporters in /var/lib/fabriclab/prometheus-sd while it runs
#     (telemetry/model/promconfig.py, standing_config);
#   - Grafana's provisioning (fabriclab's datasource and the four dashboards), always in place;
#   - Grafana itself from Grafana's package repository, else its container, where the VM can
#     reach either; where it cannot, a clear message, and the rest stays provisioned.
# Inside the VM both listen on all its addresses: the host's forwards arrive on its NIC, and the
# host side of every forward listens on 127.0.0.1 only.
# Idempotent, as root. Environment: FABRICLAB_HOST_GRAFANA / FABRICLAB_HOST_PROMETHEUS, the
# host's forwarded addresses (printed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${FABRICLAB_VENV:-$ROOT/.venv}
DISCOVERY=/var/lib/fabriclab/prometheus-sd
DASHBOARDS=/var/lib/grafana/dashboards/fabriclab
PROVISIONING=/etc/grafana/provisioning
GRAFANA_VERSION=11.6.0
HOST_GRAFANA=${FABRICLAB_HOST_GRAFANA:-http://127.0.0.1:3000}
HOST_PROMETHEUS=${FABRICLAB_HOST_PROMETHEUS:-http://127.0.0.1:9090}
STATUS=/var/lib/fabriclab/lab-status
log() { printf '[lab] %s\n' "$*"; }

[ "$(id -u)" -eq 0 ] || { echo "scripts/lab-telemetry.sh must run as root" >&2; exit 1; }
[ -d /run/systemd/system ] || { echo "scripts/lab-telemetry.sh is for the lab VM (systemd)" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || { echo "no venv at $VENV: run scripts/setup.sh first" >&2; exit 1; }
install -d -m 0755 /var/lib/fabriclab "$DISCOVERY"

wait_http() {  # URL SECONDS
  local i
  for ((i = 0; i < $2; i++)); do
    curl -fsS -m 2 -o /dev/null "$1" 2>/dev/null && return 0
    sleep 1
  done
  return 1
}

# how often: 1 s, or 5 s where the CPU is emulated (QEMU without KVM), where an exporter's
# answer takes 0.5-1.4 s (telemetry/model/promconfig.py, standing_interval)
VIRT=$(systemd-detect-virt 2>/dev/null || true)
INTERVAL=$("$VENV/bin/python" -m telemetry.model.promconfig grafana-interval --virt "${VIRT:-none}")
export FABRICLAB_SCRAPE_INTERVAL=$INTERVAL
log "Prometheus: the standing configuration (discovers fabrics in $DISCOVERY, scrapes every $INTERVAL: ${VIRT:-none})"
"$VENV/bin/python" -m telemetry.model.promconfig standing "$DISCOVERY" --virt "${VIRT:-none}" \
  > /etc/prometheus/prometheus.yml.new
promtool check config /etc/prometheus/prometheus.yml.new >/dev/null
mv /etc/prometheus/prometheus.yml.new /etc/prometheus/prometheus.yml
echo 'ARGS="--web.listen-address=:9090 --storage.tsdb.retention.time=15d"' \
  > /etc/default/prometheus
systemctl enable prometheus >/dev/null 2>&1
systemctl restart prometheus
wait_http http://127.0.0.1:9090/-/ready 60 || {
  journalctl -u prometheus -n 30 --no-pager >&2; echo "Prometheus did not start" >&2; exit 1; }

log "Grafana: provisioning and dashboards"
install -d -m 0755 "$PROVISIONING/datasources" "$PROVISIONING/dashboards" "$DASHBOARDS"
install -m 0644 telemetry/grafana/provisioning/datasources/fabriclab.yaml "$PROVISIONING/datasources/"
install -m 0644 telemetry/grafana/provisioning/dashboards/fabriclab.yaml "$PROVISIONING/dashboards/"
install -m 0644 telemetry/grafana/dashboards/*.json "$DASHBOARDS/"

# Grafana's admin is never admin/admin: a password made once for this VM, readable by root only
# (the VM's Grafana is reached only through the host's loopback forwards; visitors may view)
# shellcheck source=scripts/services.sh
. scripts/services.sh  # (the working directory is the project's)
PASSWORD_FILE=/etc/fabriclab/grafana-admin-password
GRAFANA_PASSWORD=$(grafana_admin_password "$PASSWORD_FILE")
export GF_SECURITY_ADMIN_PASSWORD=$GRAFANA_PASSWORD  # (the container's compose file reads it)

grafana_settings() {  # the environment of Debian's grafana-server unit
  local file=/etc/default/grafana-server key
  touch "$file"
  chmod 0600 "$file"
  for key in PROMETHEUS_URL FABRICLAB_SCRAPE_INTERVAL GF_SERVER_HTTP_PORT GF_AUTH_ANONYMOUS_ENABLED \
             GF_AUTH_ANONYMOUS_ORG_ROLE GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH \
             GF_SECURITY_ADMIN_PASSWORD GF_USERS_ALLOW_SIGN_UP; do
    sed -i "/^$key=/d" "$file"
  done
  cat >> "$file" <<EOF
PROMETHEUS_URL=http://127.0.0.1:9090
FABRICLAB_SCRAPE_INTERVAL=$INTERVAL
GF_SERVER_HTTP_PORT=3000
GF_AUTH_ANONYMOUS_ENABLED=true
GF_AUTH_ANONYMOUS_ORG_ROLE=Viewer
GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH=$DASHBOARDS/fabriclab-fabric.json
GF_SECURITY_ADMIN_PASSWORD=$GRAFANA_PASSWORD
GF_USERS_ALLOW_SIGN_UP=false
EOF
}

grafana=""
if dpkg-query -W -f='${Status}' grafana 2>/dev/null | grep -q "install ok installed"; then
  grafana=package
elif curl -fsS -m 15 -o /tmp/grafana.gpg.key https://apt.grafana.com/gpg.key 2>/dev/null; then
  log "Grafana $GRAFANA_VERSION from Grafana's package repository"
  gpg --batch --yes --dearmor -o /usr/share/keyrings/grafana.gpg /tmp/grafana.gpg.key
  echo "deb [signed-by=/usr/share/keyrings/grafana.gpg] https://apt.grafana.com stable main" \
    > /etc/apt/sources.list.d/grafana.list
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "grafana=$GRAFANA_VERSION" >/dev/null
  grafana=package
elif curl -sS -m 15 -o /dev/null https://registry-1.docker.io/v2/ 2>/dev/null; then
  log "Grafana $GRAFANA_VERSION as a container (telemetry/grafana/compose.yaml)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose >/dev/null
  docker-compose -f telemetry/grafana/compose.yaml up -d
  grafana=container
fi
if [ "$grafana" = package ]; then
  grafana_settings
  systemctl enable grafana-server >/dev/null 2>&1
  systemctl restart grafana-server
  # (the variable sets the password of a new database only: an existing admin's is reset)
  grafana-cli --homepath /usr/share/grafana admin reset-admin-password "$GRAFANA_PASSWORD" \
    >/dev/null 2>&1 || true
fi
if [ -n "$grafana" ]; then
  wait_http http://127.0.0.1:3000/api/health 120 || {
    echo "Grafana did not answer on port 3000 within 120 s" >&2; exit 1; }
  echo "grafana=$grafana" > "$STATUS"
  grafana_line="Grafana:    $HOST_GRAFANA  (dashboards in the folder fabriclab; visitors view,
            the admin's password is in $PASSWORD_FILE in the VM)"
else
  echo "grafana=unreachable" > "$STATUS"
  grafana_line="Grafana:    not installed: this VM reaches neither Grafana's package repository
            (apt.grafana.com) nor its container registry (registry-1.docker.io). Its
            datasource and dashboards are provisioned in $PROVISIONING and $DASHBOARDS;
            'vagrant provision' installs it once the VM can reach either."
  log "Grafana cannot be installed here (no route to apt.grafana.com or registry-1.docker.io); the rest is provisioned"
fi

datapath="userspace datapath only: this kernel has no openvswitch module"
modprobe -q openvswitch 2>/dev/null && datapath="Open vSwitch kernel datapath"
cat <<EOF

fabriclab lab VM is ready (kernel $(uname -r), $datapath).
Next:
  vagrant ssh
  cd /vagrant && sudo .venv/bin/fabriclab run experiments/quickstart.yaml --out runs/quickstart --telemetry --keep
Prometheus: $HOST_PROMETHEUS  (scrapes every fabric that is up in the VM, every $INTERVAL)
$grafana_line
EOF
