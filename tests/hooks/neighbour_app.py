"""A Ray Serve application that is not the fleet, deployed declaratively beside it in the test
cluster (tests/fleet/test_cluster.py): a fleet deploy must leave it running."""

from __future__ import annotations

from ray import serve
from starlette.requests import Request


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Neighbour:
    async def __call__(self, request: Request) -> str:
        return "neighbour"


app = Neighbour.bind()
