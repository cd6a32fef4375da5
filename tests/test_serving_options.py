"""How a Ray deployment is described: ``serve run``'s ``key=value``
arguments read as ``oxillama serve`` flags, the replica and autoscaling
options checked before anything starts, and what a deployment refuses."""

from __future__ import annotations

import os

import pytest

from oxillama import OxiLlamaError, ParameterError
from oxillama.cli.main import main
from oxillama.serving.flags import serve_options_from_mapping
from oxillama.serving.http.app_spec import AppSpec
from oxillama.serving.ray.options import RayOptions


def test_serve_run_arguments_are_the_serve_flags() -> None:
    spec, options = serve_options_from_mapping(
        {
            "model": "m.gguf",
            "sessions_dir": "/store",
            "replicas": "3",
            "max-batch": 4,
            "persist_turns": "true",
            "metrics_auth": False,
            "lora": ["a=a.gguf", "b=b.gguf"],
            "drain_seconds": "12.5",
        }
    )
    assert isinstance(spec, AppSpec)
    assert (spec.model, spec.sessions_dir, spec.max_batch) == ("m.gguf", "/store", 4)
    assert spec.limits.persist_turns and not spec.metrics_auth
    assert spec.loras == {"a": "a.gguf", "b": "b.gguf"}
    assert (options.replicas, options.drain_seconds, options.max_replicas) == (3, 12.5, None)
    # The defaults are the command's.
    assert (spec.context_size, spec.limits.max_sessions, options.replica_cpus) == (2048, 64, 1.0)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"modle": "m.gguf"}, "unknown argument 'modle'"),
        ({"port": "8000"}, "unknown argument 'port'"),
        ({"replicas": "two"}, "invalid int value"),
        ({"persist_turns": "maybe"}, "persist_turns takes true or false"),
        ({"speculative": "eagle"}, "invalid choice"),
        ({"model": "m.gguf", "hf": "org/repo"}, "give --model or --hf, not both"),
        ({"min_replicas": "1"}, "min_replicas needs max_replicas"),
        ({"max_replicas": "2", "min_replicas": "3"}, "at least min_replicas"),
        ({"target_ongoing_requests": "4"}, "needs max_replicas"),
        ({"replicas": "0"}, "at least 1"),
    ],
)
def test_bad_arguments_are_refused_by_name(args: dict[str, str], words: str) -> None:
    with pytest.raises(ParameterError, match=words):
        serve_options_from_mapping(args)


def test_autoscaling_passes_through() -> None:
    options = RayOptions(min_replicas=1, max_replicas=4, target_ongoing_requests=6)
    assert options.autoscaling() == {
        "min_replicas": 1,
        "max_replicas": 4,
        "initial_replicas": 1,
        "target_ongoing_requests": 6,
    }
    assert RayOptions(replicas=3).autoscaling() is None


def test_ray_accepts_the_deployment_options() -> None:
    """Ray Serve checks deployment options when the application is bound;
    ours (fixed replicas, autoscaling, the router's import path) pass."""
    from ray.serve import Application

    from oxillama.serving.ray.deployment import deployment

    spec = AppSpec("m.gguf", sessions_dir="/store")
    for options in (
        RayOptions(replicas=3, replica_cpus=2, max_ongoing_requests=4),
        RayOptions(min_replicas=0, max_replicas=3, target_ongoing_requests=4),
    ):
        assert isinstance(deployment(spec, options), Application)


def test_a_deployment_needs_a_shared_store() -> None:
    from oxillama.serving.ray.deployment import deployment

    with pytest.raises(ParameterError, match="sessions folder every replica shares"):
        deployment(AppSpec("m.gguf"))


def test_replicas_without_ray_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--replicas", "2"]) == 2
    assert "--replicas and --max-replicas need --ray" in capsys.readouterr().err
    assert issubclass(ParameterError, OxiLlamaError)


@pytest.mark.parametrize(
    ("address", "env", "host", "loopback"),
    [
        (None, None, "127.0.0.1", True),
        (None, None, "localhost", True),
        (None, None, "::1", True),
        ("local", None, "127.0.0.1", True),
        (None, None, "0.0.0.0", False),
        (None, None, "192.0.2.7", False),
        ("10.0.0.5:6379", None, "127.0.0.1", False),
        (None, "auto", "127.0.0.1", False),
    ],
)
def test_a_local_cluster_is_started_on_loopback(
    monkeypatch: pytest.MonkeyPatch, address: str | None, env: str | None, host: str, loopback: bool
) -> None:
    """`oxillama serve --ray` starts its local cluster with the node
    address 127.0.0.1 (so Ray's processes listen there only) unless
    --ray-address or $RAY_ADDRESS names a cluster or --host is another
    interface; Ray's single-node switch is off only while it starts."""
    import ray
    from ray._private import ray_constants

    from oxillama.serving.ray.run import init_ray

    switch = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    monkeypatch.delenv(switch, raising=False)
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    calls = []

    def init(**kwargs: object) -> None:
        calls.append((kwargs, os.environ.get(switch), ray_constants.ENABLE_RAY_CLUSTER))

    monkeypatch.setattr(ray, "init", init)
    multi_node_before = ray_constants.ENABLE_RAY_CLUSTER
    init_ray(address, host, num_cpus=1)
    [(kwargs, switch_env, multi_node)] = calls
    assert kwargs["address"] == address and kwargs["num_cpus"] == 1
    if loopback:
        assert kwargs["_node_ip_address"] == "127.0.0.1"
        assert (switch_env, multi_node) == ("0", False)
    else:
        assert "_node_ip_address" not in kwargs
        assert (switch_env, multi_node) == (None, multi_node_before)
    assert switch not in os.environ
    assert ray_constants.ENABLE_RAY_CLUSTER == multi_node_before
