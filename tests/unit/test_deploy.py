"""The deployment files in deploy/ and the TOML examples in the docs, checked as far as
this machine can check them (docs/OPERATIONS.md).

* Every TOML file in deploy/, each with its commented-out ``# [[...]]`` examples put
  back, and every ```toml block of the docs, loads through the gateway's own loader.
* The systemd unit passes ``systemd-analyze verify`` (scripts/services installs it)
  and its stop timeout covers the gateway's shutdown.
* The nginx site passes ``nginx -t`` (scripts/services installs nginx), and its
  limits and timeouts agree with deploy/production.toml.
* The compose file has the services, ports, volumes and healthchecks it promises, and
  the files it mounts exist.
* The Containerfile copies only what exists, installs requirements.lock, and runs as
  a user other than root.

Images are not built here: there is no container engine on the test machine.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from bridges.config import AmqpBridgeConfig
from gateway.admin import mirroring
from gateway.server.config import Config, load
from gateway.server.shutdown import CANCEL_WAIT
from spark_sink import service

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
EXAMPLES = sorted(DEPLOY.glob("*.toml"))
DOC_PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
UNIT = DEPLOY / "restms-gateway.service"
# What the gateway may spend stopping, past shutdown_grace: cancelled requests unwind,
# the mirror's writer finishes its files, the analytics worker ends.
STOP_EXTRA = CANCEL_WAIT + mirroring.STOP_WAIT + service.STOP_WAIT


def tool(name: str) -> str:
    """The path of a tool scripts/services installs; fail (never skip) without it."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if found is None:
        pytest.fail(f"{name} is not installed: run scripts/services (it installs it as root)")
    return found


def uncommented(text: str) -> str:
    """``text`` with each commented-out table example (``# [[bridges]]`` and the
    ``# key = value`` lines after it, up to a blank or ``# ----`` line) put back."""
    out, inside = [], False
    for line in text.splitlines():
        if re.match(r"# \[\[\w+\]\]\s*$", line):
            inside = True
        elif inside and (not line.strip() or line.startswith("# ----")):
            inside = False
        if inside and line.startswith("#"):
            out.append(line[2:] if line.startswith("# ") else line[1:])
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def doc_blocks() -> list[tuple[str, str]]:
    blocks = []
    for page in DOC_PAGES:
        text = page.read_text(encoding="utf-8")
        for found in re.finditer(r"^```toml\n(.*?)^```", text, re.S | re.M):
            line = text.count("\n", 0, found.start()) + 1
            blocks.append((f"{page.name}:{line}", found.group(1)))
    return blocks


def seconds(value: str) -> float:
    """An nginx or systemd time span: ``330s``, ``1m``, ``90``."""
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", value.strip()).groups()  # type: ignore[union-attr]
    return float(number) * {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[unit]


def nginx_size(value: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([kmg]?)", value.strip().lower()).groups()  # type: ignore[union-attr]
    return int(number) * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[unit]


def production() -> Config:
    return load(str(DEPLOY / "production.toml"), env={})


# ---------------------------------------------------------------- configuration files


def test_deploy_has_the_files_operations_md_describes() -> None:
    names = {p.name for p in DEPLOY.iterdir()}
    wanted = {"gateway.example.toml", "production.toml", "compose.toml", "compose.yaml"}
    wanted |= {"Containerfile", "nginx.conf", "restms-gateway.service", "rabbitmq"}
    assert wanted <= names
    operations = (ROOT / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")
    for name in wanted - {"rabbitmq"}:
        assert f"deploy/{name}" in operations, name


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_deploy_toml_loads_through_the_gateways_loader(path: Path) -> None:
    config = load(str(path), env={})
    assert config.domains[0][0] == "default"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_commented_table_examples_load_too(path: Path, tmp_path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    restored = uncommented(text)
    copy = tmp_path / path.name
    copy.write_text(restored, encoding="utf-8")
    config = load(str(copy), env={})
    # Every "# [[bridges]]" example became a bridge (none was left commented out).
    assert len(config.bridges) == len(re.findall(r"^#? ?\[\[bridges\]\]", text, re.M))


def test_uncommenting_stops_at_the_end_of_an_example() -> None:
    text = "# [[users]]\n# name = 'a'\n\n# a comment\n# ---- next\n# [[feeds]]\n# name = 'b'\n"
    assert uncommented(text) == "[[users]]\nname = 'a'\n\n# a comment\n# ---- next\n" + (
        "[[feeds]]\nname = 'b'\n"
    )


def test_gateway_example_sets_every_scalar_key() -> None:
    """The annotated example is the list of keys: a new key must be added to it."""
    data = tomllib.loads((DEPLOY / "gateway.example.toml").read_text(encoding="utf-8"))
    assert scalar_keys() - set(data) == set()


def scalar_keys() -> set[str]:
    tables = {"domains", "feeds", "bridges", "issuers", "clients", "users", "domain_principals"}
    return {f.name for f in dataclasses.fields(Config) if f.init and f.name not in tables}


def test_configuration_md_lists_every_environment_variable() -> None:
    text = (ROOT / "docs" / "CONFIGURATION.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"\bRESTMS_([A-Z0-9_]+)\b", text))
    assert {key.upper() for key in scalar_keys()} - listed == set()


@pytest.mark.parametrize(("where", "block"), doc_blocks(), ids=[w for w, _ in doc_blocks()])
def test_every_toml_block_in_the_docs_loads(where: str, block: str, tmp_path: Path) -> None:
    path = tmp_path / "block.toml"
    path.write_text(block, encoding="utf-8")
    load(str(path), env={})


def test_doc_blocks_were_found() -> None:
    places = {where.split(":")[0] for where, _ in doc_blocks()}
    assert {"CONFIGURATION.md", "AUTH.md", "AMQP.md", "ZEROMQ.md"} <= places


def test_metrics_named_in_operations_md_are_in_metrics_md() -> None:
    metrics = (ROOT / "docs" / "METRICS.md").read_text(encoding="utf-8")
    known = set(re.findall(r"\b(restms_[a-z_]+)", metrics))
    named = set(
        re.findall(
            r"\b(restms_[a-z_]+)", (ROOT / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")
        )
    )
    assert named
    suffixes = r"_(total|sum|count|bucket)$"
    assert {n for n in named if n not in known and re.sub(suffixes, "", n) not in known} == set()


# ---------------------------------------------------------------- systemd


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = tool("systemd-analyze")
    # verify checks that ExecStart's program exists: point it at this venv's Python.
    text = UNIT.read_text(encoding="utf-8").replace("/opt/restms/.venv/bin/python", sys.executable)
    unit = tmp_path / UNIT.name
    unit.write_text(text, encoding="utf-8")
    done = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    # Unknown keys and bad values are only warnings: any output is a failure.
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_systemd_analyze_verify_catches_a_bad_unit(tmp_path: Path) -> None:
    analyze = tool("systemd-analyze")
    unit = tmp_path / "bad.service"
    unit.write_text(f"[Service]\nExecStart={sys.executable}\nKillMod=mixed\n", encoding="utf-8")
    done = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    assert "KillMod" in done.stderr


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_unit_hardening_and_shutdown() -> None:
    s = unit_settings()
    assert s["User"] == ["restms"]
    assert s["StateDirectory"] == ["restms"]
    assert s["ReadWritePaths"] == [production().data_dir]
    for key in ("NoNewPrivileges", "PrivateTmp", "ProtectHome"):
        assert s[key] == ["yes"], key
    assert s["ProtectSystem"] == ["strict"]
    assert s["KillSignal"] == ["SIGTERM"]
    assert s["KillMode"] == ["mixed"]
    assert s["Restart"] == ["on-failure"]
    # Enough descriptors for max_connections sockets, twice (the proxy's side too).
    assert int(s["LimitNOFILE"][0]) >= 2 * production().max_connections
    # systemd's SIGKILL must not cut the drain, the writer or the worker short.
    assert seconds(s["TimeoutStopSec"][0]) >= production().shutdown_grace + STOP_EXTRA
    assert "--config /etc/restms/gateway.toml" in s["ExecStart"][0]


# ---------------------------------------------------------------- nginx


def nginx_test(tmp_path: Path, site: str) -> subprocess.CompletedProcess[str]:
    """``nginx -t`` on ``site`` inside a minimal main configuration of its own, with
    the site's certificate and log paths replaced by files made here."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "restms.example.com")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    site = re.sub(r"/etc/\S+?privkey\.pem", str(tmp_path / "key.pem"), site)
    site = re.sub(r"/etc/\S+?\.pem", str(tmp_path / "cert.pem"), site)
    site = site.replace("/var/log/nginx/", f"{tmp_path}/")
    (tmp_path / "site.conf").write_text(site, encoding="utf-8")
    temp = " ".join(
        f"{kind}_temp_path {tmp_path}/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    main = tmp_path / "nginx.conf"
    main.write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{\n{temp}\naccess_log {tmp_path}/access.log;\ninclude {tmp_path}/site.conf;\n}}\n",
        encoding="utf-8",
    )
    command = [tool("nginx"), "-t", "-p", str(tmp_path), "-c", str(main)]
    command += ["-e", str(tmp_path / "error.log")]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_nginx_site_passes_nginx_t(tmp_path: Path) -> None:
    done = nginx_test(tmp_path, (DEPLOY / "nginx.conf").read_text(encoding="utf-8"))
    assert done.returncode == 0, done.stderr
    assert "test is successful" in done.stderr


def test_nginx_t_catches_a_bad_site(tmp_path: Path) -> None:
    done = nginx_test(tmp_path, "server { listen 8080; proxy_read_timeoutt 1s; }\n")
    assert done.returncode != 0
    assert "proxy_read_timeoutt" in done.stderr


def directives(text: str) -> dict[str, list[str]]:
    """Each directive's values in file order (comments dropped), by name."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([a-z_0-9]+)\s+(.*?);", line.split("#", 1)[0].strip())
        if match:
            found.setdefault(match.group(1), []).append(match.group(2))
    return found


def test_nginx_limits_agree_with_the_production_config() -> None:
    config = production()
    text = (DEPLOY / "nginx.conf").read_text(encoding="utf-8")
    d = directives(text)
    assert nginx_size(d["client_max_body_size"][0]) == config.max_body
    server_read, pipes_read = (seconds(v) for v in d["proxy_read_timeout"])
    assert server_read > config.max_wait
    assert pipes_read > max(config.stream_max, config.websocket_max_life)
    assert seconds(d["keepalive_timeout"][0]) < config.keepalive_timeout  # upstream's
    assert d["server"][0] == f"{config.host}:{config.port}"
    # The pipes' location does not buffer (SSE, streams) and upgrades WebSockets.
    pipes = text[text.index("location /restms/resource/") :]
    pipes = pipes[: pipes.index("}")]
    assert "proxy_buffering off;" in pipes
    assert d["proxy_set_header"].count("Upgrade           $http_upgrade") == 1
    # The request is marked as relayed, so it is never a loopback guest (docs/AUTH.md).
    assert "X-Forwarded-For   $proxy_add_x_forwarded_for" in d["proxy_set_header"]
    # TLS to the gateway: its documents' URIs take the scheme of its own listener.
    assert config.tls_cert
    assert all(p.startswith("https://") for p in d["proxy_pass"])


# ---------------------------------------------------------------- compose


def compose() -> dict[str, Any]:
    spec = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(spec, dict)
    return spec


def test_compose_services_ports_volumes_and_healthchecks() -> None:
    spec = compose()
    services = spec["services"]
    assert set(services) == {"gateway", "rabbitmq", "spark-master", "spark-worker"}
    for name, service_spec in services.items():
        check = service_spec["healthcheck"]["test"]
        assert check[0] in ("CMD", "CMD-SHELL"), name
        assert len(check) > 1, name
    assert "/healthz" in " ".join(services["gateway"]["healthcheck"]["test"])
    assert services["gateway"]["ports"] == ["127.0.0.1:8080:8080"]
    assert "127.0.0.1:15672:15672" in services["rabbitmq"]["ports"]
    assert set(spec["volumes"]) == {"restms-data", "rabbitmq-data"}
    gateway = services["gateway"]
    assert gateway["init"] is True
    assert gateway["stop_signal"] == "SIGTERM"
    assert gateway["depends_on"]["rabbitmq"]["condition"] == "service_healthy"
    # The lake is at the same path for the driver and the executors.
    assert "restms-data:/var/lib/restms" in gateway["volumes"]
    assert "restms-data:/var/lib/restms" in services["spark-worker"]["volumes"]


def test_compose_mounts_and_builds_what_exists() -> None:
    spec = compose()
    for name, service_spec in spec["services"].items():
        for volume in service_spec.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), (name, source)
    build = spec["services"]["gateway"]["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == ROOT
    assert (context / build["dockerfile"]).is_file()
    assert f"AS {build['target']}" in (context / build["dockerfile"]).read_text(encoding="utf-8")
    plugins = (DEPLOY / "rabbitmq" / "enabled_plugins").read_text(encoding="utf-8")
    assert re.fullmatch(r"\[[a-z0-9_,]+\]\.\n", plugins)
    assert "rabbitmq_amqp1_0" in plugins


def test_compose_gateway_config_and_stop_grace() -> None:
    gateway = compose()["services"]["gateway"]
    config_path = gateway["command"][gateway["command"].index("--config") + 1]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in gateway["volumes"]}
    config = load(str(DEPLOY / mounted[config_path]), env={})
    assert config.analytics_master == "spark://spark-master:7077"
    assert seconds(gateway["stop_grace_period"]) >= config.shutdown_grace + STOP_EXTRA
    # The origin clients use is the port published on the host; inside the container
    # their connections are not loopback, so the names they use must be configured.
    (published,) = (p for p in gateway["ports"] if p.endswith(":8080"))
    address, port, _ = published.split(":")
    assert config.public_url == f"http://localhost:{port}"
    assert f"{address}:{port}" in config.allowed_hosts.replace(",", " ").split()
    # The bridges reach the broker by its service name, as the user compose makes.
    rabbit = compose()["services"]["rabbitmq"]["environment"]
    assert len(config.bridges) == 2
    for bridge in config.bridges:
        assert isinstance(bridge, AmqpBridgeConfig)
        assert bridge.urls == ("amqp://rabbitmq:5672",)
        assert (bridge.user, bridge.password) == (
            rabbit["RABBITMQ_DEFAULT_USER"],
            rabbit["RABBITMQ_DEFAULT_PASS"],
        )


def test_compose_spark_matches_the_locked_pyspark_and_the_image_user() -> None:
    lock = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    pyspark = re.search(r"^pyspark==(\S+)$", lock, re.M).group(1)  # type: ignore[union-attr]
    services = compose()["services"]
    for name in ("spark-master", "spark-worker"):
        assert services[name]["image"] == f"apache/spark:{pyspark}", name
    containerfile = (DEPLOY / "Containerfile").read_text(encoding="utf-8")
    uid = re.search(r"^ARG UID=(\d+)$", containerfile, re.M).group(1)  # type: ignore[union-attr]
    gid = re.search(r"^ARG GID=(\d+)$", containerfile, re.M).group(1)  # type: ignore[union-attr]
    assert services["spark-worker"]["user"] == f"{uid}:{gid}"


# ---------------------------------------------------------------- Containerfile


def stages() -> list[tuple[str, list[str]]]:
    """The Containerfile's stages: (name, instructions with continuations joined)."""
    text = (DEPLOY / "Containerfile").read_text(encoding="utf-8")
    text = re.sub(r"\\\n\s*", " ", text)
    found: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            found.append((line.split(" AS ")[-1].strip(), []))
        if found:
            found[-1][1].append(line)
    return found


def test_containerfile_copies_only_what_exists_and_ignores_none_of_it() -> None:
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = 0
    for _, lines in stages():
        for line in lines:
            if line.startswith("COPY ") and "--from=" not in line:
                *sources, _ = line.split()[1:]
                for source in sources:
                    assert (ROOT / source).exists(), source
                    assert source not in ignored
                    assert source.split("/")[0] not in ignored
                    copied += 1
    assert copied >= 8
    # Every package the gateway imports is in the image.
    for package in ("restms", "feeds", "auth", "bridges", "gateway", "admincli", "spark_sink"):
        assert any(f"COPY {package} " in line for _, lines in stages() for line in lines)


def test_containerfile_copies_every_file_the_code_reads_from_the_project() -> None:
    """Files the gateway reads at run time by their place in the project (the
    extension profile, the OpenAPI file) must be in the image too."""
    copied = {
        line.split()[1]
        for _, lines in stages()
        for line in lines
        if line.startswith("COPY ") and "--from=" not in line
    }
    pattern = re.compile(r"(?:parents\[\d\]|\bROOT)\s*/\s*\"([^\"]+)\"")
    read = set()
    for package in ("restms", "feeds", "auth", "bridges", "gateway", "admincli", "spark_sink"):
        for module in (ROOT / package).rglob("*.py"):
            read |= set(pattern.findall(module.read_text(encoding="utf-8")))
    assert read  # the scan finds what it looks for
    assert read - copied == set()


def test_containerfile_installs_the_lock_file_runs_unprivileged_checks_healthz() -> None:
    found = dict(stages())
    assert list(found) == ["build", "runtime", "analytics", "gateway"]
    build = " ".join(found["build"])
    assert "COPY requirements.lock" in build
    assert "--requirement requirements.lock" in build
    assert "python:3.11-slim" in (DEPLOY / "Containerfile").read_text(encoding="utf-8")
    runtime = found["runtime"]
    users = [line for line in runtime if line.startswith("USER ")]
    assert users == ["USER restms"]
    assert any(line.startswith("VOLUME") and "/var/lib/restms" in line for line in runtime)
    health = next(line for line in runtime if line.startswith("HEALTHCHECK"))
    assert "RESTMS_HEALTH_URL" in health
    assert any("RESTMS_HEALTH_URL=http://127.0.0.1:8080/healthz" in line for line in runtime)
    # Java only in the analytics image; each image ends as the unprivileged user.
    assert not any("openjdk" in line for line in found["build"] + runtime + found["gateway"])
    assert any("openjdk-17-jre-headless" in line for line in found["analytics"])
    assert [line for line in found["analytics"] if line.startswith("USER ")][-1] == "USER restms"
    # The image without Java never tries to start Spark.
    assert "ENV RESTMS_ANALYTICS=false" in found["gateway"]
    assert not any("RESTMS_ANALYTICS=" in line for line in runtime + found["analytics"])
