"""Baseline servers for `bench.flap`: the same protocol subset, built the plain ways.

- `link_bound`: a plain aiohttp handler; the conversation lives in the handler, so a
  reconnect starts from nothing.
- `stateless`: no actors; every turn loads the conversation from PostgreSQL and writes it
  back.

Both answer with the same rehearsal model as stillhere (`providers.rehearsal`), so the
benchmark compares architectures under the same model and the same phones.
"""
