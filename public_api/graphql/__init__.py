"""GraphQL at /public_graphql: the push-message feed (query and subscription), shipments, their
exceptions, documents and webhook deliveries, for API clients (docs/graphql.md;
docs/decisions.md, D9)."""

from public_api.graphql.views import setup

__all__ = ["setup"]
