"""openpi's WebSocket policy protocol, both ends: ``codec`` (msgpack with numpy arrays, as
openpi's wire carries them), the server of any rlmesh model to openpi's clients, and the
client of openpi's servers (a ``Model``).

The protocol, as its public sources and a real peer show it (no code of theirs is used):

- one WebSocket per client, no subprotocol, no compression; on connect the server sends one
  binary frame, ``msgpack(metadata)``;
- then strict lockstep: a binary frame ``msgpack(observation)`` in, a binary frame
  ``msgpack(result)`` out, where ``result["actions"]`` is an ``(H, D)`` chunk; no request
  ids, no episode or reset messages;
- an error is a text frame holding the traceback, then close code 1011;
- ``GET /healthz`` answers 200; a client may send ``Authorization: Api-Key <key>``.
"""
