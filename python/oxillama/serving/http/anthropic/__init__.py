"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``)
on the server: request schemas and translation to chat messages
(:mod:`.schemas`, :mod:`.translate`), replies as content blocks and their
event stream (:mod:`.blocks`, :mod:`.routes`), errors in Anthropic's shape
(:mod:`.errors`) and the routes' OpenAPI entries (:mod:`.openapi`).

Nothing is imported here: the middlewares import :mod:`.errors` alone."""
