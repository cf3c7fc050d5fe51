"""The push message feed: writing messages with their deliveries (`publish`), and reading them in
pages or live through the per-process hub (`reader`)."""
