"""A Ray Serve application that is not the fleet, deployed declaratively beside it in the test
cluster (tests/fleet/test_cluster.py): a fleet deploy must leave it running."""

from __future__ import annotations

from ray import serve
from starlette.requests import Request


class Neighbour:
    async def __call__(self, request: Request) -> str:
        return "neighbour"


# Called rather than applied as a class decorator, which mypy takes to leave the class as it is.
app = serve.deployment(ray_actor_options={"num_cpus": 0})(Neighbour).bind()
