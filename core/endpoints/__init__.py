"""Customers' webhook endpoints (what one is, its kind, the URL and egress rules) and what a
delivery to one is (its statuses, claim, attempt result and retry schedule): the records the
feed writes a message's deliveries from, and the outbox above it works through."""
