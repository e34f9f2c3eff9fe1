"""The OpenEnv face: every hosted environment served to OpenEnv clients (TRL's ``environment_factory``,
``GenericEnvClient``, ``MCPToolClient``) at ``/openenv/{team}/{slug}[@N]/``.

It speaks OpenEnv 0.10's wire (``/ws`` frames, JSON-RPC at ``/mcp``, ``/health``, ``/metadata``,
``/schema``, the stateless ``/reset`` ``/step`` ``/state`` and the task routes) and maps it onto ORS
episodes the way upstream's ORS importer template (``openenv import --type ors``) does; every episode
goes through the shared ``EpisodeGateway``, so sessions, the audit log, limits, tenancy and analytics
are those of the ORS face.

- ``wire.py``: frames, error codes, request validation, JSON schemas (no I/O).
- ``episodes.py``: an OpenEnv session (one socket, or one MCP session) and its reset/step/state/close
  in terms of the gateway.
- ``consumer.py``: the Channels WebSocket consumer for ``/ws``.
- ``app.py``: the lean ASGI app for HTTP under ``/openenv/`` (``/mcp`` included) and the WebSocket router.
- ``selectors.py``: what ``/metadata`` reads (description, README, team).
"""
