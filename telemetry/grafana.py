"""The Grafana adapter: Grafana (a pinned image) started through the Docker SDK for Python,
with the repository's provisioning (datasource and dashboards) mounted and the run's
Prometheus as its datasource, on 127.0.0.1 only.

Where the Docker daemon or the image is missing (this machine: the daemon pulls nothing), one
:class:`TestbedError` says which, and the caller carries on without Grafana.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from telemetry.model.promconfig import DEFAULT_SCRAPE_INTERVAL_S, grafana_interval
from testbed.errors import TestbedError
from testbed.linux.files import write_text_atomic

IMAGE = "grafana/grafana:11.6.0"
GRAFANA_DIR = Path(__file__).resolve().parent / "grafana"
DEFAULT_PORT = 3000


@dataclass
class Grafana:
    """A started Grafana container; ``admin_password``: its admin's (random, per start)."""

    container: object
    port: int
    admin_password: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.container.stop(timeout=10)


def grafana_environment(prometheus_port: int, port: int, scrape_interval_s: float,
                        admin_password: str) -> dict[str, str]:
    """The container's settings: on 127.0.0.1 only, anonymous visitors may view (never edit),
    the admin has ``admin_password`` (Grafana's default, ``admin``, is refused)."""
    if len(admin_password) < 12 or admin_password == "admin":
        raise ValueError("Grafana's admin password must be a random one of 12 characters or more")
    return {"PROMETHEUS_URL": f"http://127.0.0.1:{prometheus_port}",
            "FABRICLAB_SCRAPE_INTERVAL": grafana_interval(scrape_interval_s),
            "GF_SERVER_HTTP_ADDR": "127.0.0.1", "GF_SERVER_HTTP_PORT": str(port),
            "GF_AUTH_ANONYMOUS_ENABLED": "true", "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
            "GF_SECURITY_ADMIN_USER": "admin", "GF_SECURITY_ADMIN_PASSWORD": admin_password,
            "GF_USERS_ALLOW_SIGN_UP": "false"}


def save_password(directory: Path, password: str) -> Path:
    """Write ``password`` to ``directory/grafana-admin-password`` readable by its owner only
    (created 0600, never world-readable even for a moment)."""
    path = Path(directory) / "grafana-admin-password"
    write_text_atomic(path, password + "\n", mode=0o600)  # no link followed, nothing chmod-ed
    return path


OWNER_LABEL = "org.fabriclab.owner"  # a container fabriclab started: the PID of its command


def start_grafana(prometheus_port: int, port: int = DEFAULT_PORT,
                  scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
                  password_dir: Path | None = None) -> Grafana:
    """Start Grafana on 127.0.0.1:``port`` with Prometheus at 127.0.0.1:``prometheus_port``,
    whose data was scraped every ``scrape_interval_s`` (the datasource's ``timeInterval``, so
    that ``$__rate_interval`` spans enough samples).

    The admin's password is random, saved 0600 in ``password_dir`` (when given) and kept on
    the returned object; anonymous visitors only view.

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
    password = secrets.token_urlsafe(18)
    if password_dir is not None:
        save_password(password_dir, password)
    container = client.containers.run(
        IMAGE, detach=True, auto_remove=True, network_mode="host", name=f"fabriclab-grafana-{port}",
        labels={OWNER_LABEL: str(os.getpid())},  # ours: whoever looks can tell
        environment=grafana_environment(prometheus_port, port, scrape_interval_s, password),
        volumes={str(GRAFANA_DIR / "provisioning"): {"bind": "/etc/grafana/provisioning",
                                                     "mode": "ro"},
                 str(GRAFANA_DIR / "dashboards"): {"bind": "/var/lib/grafana/dashboards/fabriclab",
                                                   "mode": "ro"}})
    return Grafana(container, port, password)
