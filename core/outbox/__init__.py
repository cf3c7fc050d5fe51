"""The webhook outbox: customers' endpoints, deliveries with their retry schedule, attempts and
operator recovery. Transport-free: `webhooks/` makes the HTTP calls."""
