"""vla-eval's WebSocket protocol, both ends: ``codec`` (msgpack envelopes with numpy arrays
and PNG images, as vla-eval's wire carries them; ``png`` writes and reads the images without
Pillow), the server of any rlmesh model to vla-eval's clients (``serve_vlaeval``), and the
client of vla-eval's model servers (``VlaEvalModel``, a ``Model``).

The protocol, as its public sources and a real peer (``vla-eval`` 0.8.0) show it (no code of
theirs is used):

- one WebSocket per client session, no subprotocol, no compression; every message is one
  binary frame, ``msgpack({"type", "payload", "seq", "timestamp"})``;
- the client sends ``hello`` first and the server answers ``hello`` (its version and
  ``capabilities``); then ``episode_start`` and ``episode_end`` (no answer) bracket each
  episode, and each ``observation`` is answered by one ``action`` echoing its ``seq``, whose
  payload holds ``"actions"``: one action ``(D,)`` or a chunk ``(H, D)``;
- a failure is answered by an ``error`` message (``{"error": text}``, the request's ``seq``),
  and the connection stays open;
- ``GET /health`` answers 200 ``{"status": "ok"}``, ``GET /config`` the batching settings.

Where the peer departs from its own description is noted where it matters: the codec (images,
dtypes), the server (malformed messages), the client (``seq`` matching).

Example (both ends of rlmesh, on loopback):
    >>> import numpy as np
    >>> from rlmesh.remote.vlaeval.client import VlaEvalModel
    >>> from rlmesh.remote.vlaeval.server import serve_vlaeval
    >>> with serve_vlaeval(lambda obs: obs["observation"] * 2) as server:
    ...     model = VlaEvalModel(server.address)
    ...     chunks = model.predict_chunk_batch(np.array([[1.0, 2.0]]), execution_horizon=1)
    ...     model.close()
    >>> chunks.tolist()  # one lane's chunk of one action
    [[[2.0, 4.0]]]
"""
