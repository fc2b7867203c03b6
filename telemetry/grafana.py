"""The Grafana adapter: Grafana (a pinned image) started through the Docker SDK for Python,
with the repository's provisioning (datasource and dashboards) mounted and the run's
Prometheus as its datasource, on 127.0.0.1 only.

Where the Docker daemon or the image is missing (this machine: the daemon pulls nothing), one
:class:`TestbedError` says which, and the caller carries on without Grafana.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from telemetry.model.promconfig import DEFAULT_SCRAPE_INTERVAL_S, grafana_interval
from testbed.errors import TestbedError

IMAGE = "grafana/grafana:11.6.0"
GRAFANA_DIR = Path(__file__).resolve().parent / "grafana"
DEFAULT_PORT = 3000


@dataclass
class Grafana:
    """A started Grafana container."""

    container: object
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.container.stop(timeout=10)


def start_grafana(prometheus_port: int, port: int = DEFAULT_PORT,
                  scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S) -> Grafana:
    """Start Grafana on 127.0.0.1:``port`` with Prometheus at 127.0.0.1:``prometheus_port``,
    whose data was scraped every ``scrape_interval_s`` (the datasource's ``timeInterval``, so
    that ``$__rate_interval`` spans enough samples).

    Raises:
        TestbedError: no Docker SDK, no daemon, or no image (and none can be pulled).
    """
    try:
        import docker
        from docker.errors import DockerException, ImageNotFound
    except ImportError as err:
        raise TestbedError("Grafana needs the Docker SDK for Python, fabriclab's 'grafana' "
                           "extra: .venv/bin/pip install -e '.[grafana]' (or: pip install "
                           "'fabriclab[grafana]')") from err
    try:
        client = docker.from_env()
        client.ping()
    except DockerException as err:
        raise TestbedError(f"Grafana runs in Docker, and no Docker daemon answers: {err}") \
            from err
    try:
        client.images.get(IMAGE)
    except ImageNotFound:
        try:
            client.images.pull(IMAGE)
        except DockerException as err:
            raise TestbedError(f"the Grafana image {IMAGE} is not here and cannot be pulled "
                               f"({err}); load it with 'docker load' or use the lab VM") \
                from err
    container = client.containers.run(
        IMAGE, detach=True, auto_remove=True, network_mode="host", name=f"fabriclab-grafana-{port}",
        environment={"PROMETHEUS_URL": f"http://127.0.0.1:{prometheus_port}",
                     "FABRICLAB_SCRAPE_INTERVAL": grafana_interval(scrape_interval_s),
                     "GF_SERVER_HTTP_ADDR": "127.0.0.1", "GF_SERVER_HTTP_PORT": str(port),
                     "GF_AUTH_ANONYMOUS_ENABLED": "true",
                     "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer"},
        volumes={str(GRAFANA_DIR / "provisioning"): {"bind": "/etc/grafana/provisioning",
                                                     "mode": "ro"},
                 str(GRAFANA_DIR / "dashboards"): {"bind": "/var/lib/grafana/dashboards/fabriclab",
                                                   "mode": "ro"}})
    return Grafana(container, port)
