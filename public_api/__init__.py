"""HTTP edge: OAuth2 tokens, REST document intake, GraphQL, and the operator dashboard."""
