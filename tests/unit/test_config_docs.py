"""docs/CONFIGURATION.md and the configuration class say the same: every key the
gateway reads is documented, with its environment variable when it has one, and the
page documents no key the gateway does not read."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from gateway.server.config import Config

PAGE = (Path(__file__).parents[2] / "docs" / "CONFIGURATION.md").read_text(encoding="utf-8")
KEYS = PAGE.split("\n## Keys\n", 1)[1].split("\n## The TOML file\n", 1)[0]
TOML = PAGE.split("\n## The TOML file\n", 1)[1].split("\n## Environment variables\n", 1)[0]
ENV = PAGE.split("\n## Environment variables\n", 1)[1].split("\n## Command-line flags\n", 1)[0]
FIELDS = {f.name for f in dataclasses.fields(Config) if f.init}
# Arrays of tables in the TOML file (no environment variable), and where each is told.
TABLES = {
    "domains": "### `[[domains]]`",
    "feeds": "### `[[feeds]]`",
    "bridges": "### `[[bridges]]`",
    "clients": "### `[[clients]]`",
    "issuers": "### `[[issuers]]`",
    "users": "### `[[users]]`",
    "domain_principals": "### Tenants: `principals` on `[[domains]]`",
}


def rows() -> set[str]:
    return set(re.findall(r"^\| `([a-z_0-9]+)` \|", KEYS, re.M))


def test_every_key_of_the_class_is_documented_and_no_other() -> None:
    assert set(TABLES) <= FIELDS
    documented = rows() | {key for key, heading in TABLES.items() if heading in TOML}
    assert documented == FIELDS, (
        f"undocumented: {sorted(FIELDS - documented)}; not read: {sorted(documented - FIELDS)}"
    )


def test_every_scalar_key_names_its_environment_variable_and_no_other() -> None:
    listed = {name.lower() for name in re.findall(r"RESTMS_([A-Z_0-9]+)", ENV)}
    scalars = FIELDS - set(TABLES)
    assert listed == scalars, (
        f"not listed: {sorted(scalars - listed)}; not a key: {sorted(listed - scalars)}"
    )
