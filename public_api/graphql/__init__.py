"""GraphQL at /public_graphql (DESIGN.md section 8)."""

from public_api.graphql.views import setup

__all__ = ["setup"]
