"""Webhook delivery: the outbox worker that POSTs pallet and completion messages to customers."""
