"""Document intake: the contract of `POST /documents` (`contract`), applying a document to
shipments, orders and items (`documents`), and idempotent replays (`idempotency`)."""
