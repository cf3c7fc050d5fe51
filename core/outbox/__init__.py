"""The webhook outbox: deliveries claimed, attempted, retried and given up; endpoints disabled
and enabled with their operational notices; what a client and an operator may do with endpoints
and deliveries; test sends. Transport-free: `webhooks/` makes the HTTP calls. What an endpoint
and a delivery are is `core/endpoints/`, below the feed that writes each message's deliveries."""
