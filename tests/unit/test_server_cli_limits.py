"""`nfsrdma serve` options for the connection limits and timeouts (issue 9, hole 3)."""

from __future__ import annotations

import resource

import pytest

from nfsrdma.cli import build_parser
from nfsrdma.nfs4.server_state import ServerConfig, default_max_connections
from nfsrdma.server_cli import config_of


def test_serve_options_reach_the_server_config() -> None:
    args = build_parser().parse_args(
        [
            "serve", "/srv", "--max-connections", "100", "--max-connections-per-source", "7",
            "--idle-timeout", "60", "--record-timeout", "5",
        ]
    )  # fmt: skip
    cfg = config_of(args)
    assert cfg.max_connections == 100
    assert cfg.max_connections_per_source == cfg.connections_per_source == 7
    assert cfg.idle_timeout == 60 and cfg.record_timeout == 5


def test_defaults() -> None:
    cfg = config_of(build_parser().parse_args(["serve", "/srv"]))
    assert cfg == ServerConfig()
    assert cfg.idle_timeout == 300 and cfg.record_timeout == 30
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Room is left under the descriptor limit for the VFS and everything else.
    assert 16 <= cfg.max_connections == default_max_connections()
    if soft != resource.RLIM_INFINITY and soft >= 512:
        assert cfg.max_connections <= soft - 256
    # No single address can take every connection.
    assert cfg.connections_per_source < cfg.max_connections or cfg.max_connections <= 16
    assert ServerConfig(max_connections=8).connections_per_source == 8
    assert ServerConfig(max_connections=1000).connections_per_source == 250


@pytest.mark.parametrize(
    "argv",
    [["--max-connections", "0"], ["--max-connections-per-source", "-1"], ["--idle-timeout", "-1"]],
)
def test_bad_values_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "/srv", *argv])
