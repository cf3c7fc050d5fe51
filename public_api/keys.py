"""Typed keys for what the aiohttp application carries: the services and the process's shared
parts that `dockflow/runtime.py` makes, starts and stops around the app (`create_app`)."""

from __future__ import annotations

from aiohttp import web

from core.feed.hub import FeedHub
from core.outbox.sending import EndpointSender
from core.services import Services
from core.settings import Settings

SERVICES = web.AppKey("services", Services)
SETTINGS = web.AppKey("settings", Settings)
# The process's feed follower behind GraphQL subscriptions and `pushMessages` watermarks.
FEED_HUB = web.AppKey("feed_hub", FeedHub)
# What posts test sends (`sendTestWebhook`): the webhook transport's sender, opened by the process.
TEST_SENDER = web.AppKey("test_sender", EndpointSender)
