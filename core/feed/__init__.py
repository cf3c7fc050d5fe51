"""The push message feed: message ids, one sequence per business (`ids`); writing messages with
their deliveries (`publish`); reading them in pages (`reader`) or live through the per-process
hub (`hub`, with each business's watermark in `lines` and bounded buffers in `subscribers`)."""
