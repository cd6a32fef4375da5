"""oxillama on Ray Serve (``pip install 'oxillama[ray]'``).

``oxillama serve --ray --replicas N`` or ``serve run
oxillama.serving.ray:app model=...``: every replica is an
:class:`~oxillama.AsyncEngine` behind the same Starlette app as ``oxillama
serve``; a session's turns go to the replica that holds it
(:class:`~oxillama.serving.ray.router.SessionAffinityRouter`), every turn ends
with its snapshot in the shared sessions folder, and a session whose
replica is lost continues, exactly, on another. Nothing here imports Ray
until it is used."""

from typing import Any

__all__ = ["app"]


def __getattr__(name: str) -> Any:
    # ``serve run oxillama.serving.ray:app`` and config files name the
    # builder here; Ray is imported only when it is asked for.
    if name == "app":
        from oxillama.serving.ray.deployment import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
