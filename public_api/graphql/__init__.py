"""GraphQL at /public_graphql (docs/decisions.md, D9)."""

from public_api.graphql.views import setup

__all__ = ["setup"]
