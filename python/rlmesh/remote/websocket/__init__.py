"""What rlmesh's two WebSocket policy protocols (openpi's, ``rlmesh.remote.openpi``, and
vla-eval's, ``rlmesh.remote.vlaeval``) share, each part once:

- ``server``: serving a model over a WebSocket protocol: websockets' threaded server (each
  connection's frames read, and its requests decoded and answered, on threads of its own),
  the model on one ``Batcher`` that the connections' threads lead in turn, so a model that
  infers holds up no other connection, ping or health check; the size limit, the HTTP
  endpoints' plumbing, the secret check, each connection's episode and batching key;
- ``inputs``: how an observation (a dict) becomes one lane of a model's input, as its spec
  reads it, and which observations may share a model call;
- ``client``: a ``Model`` whose chunks come from such a server: its event loop on a thread
  of its own, a connection per lane (a slot), every wait bounded, ``close``.

Each protocol keeps what is its own: its codec, its message flow, its form of errors and its
endpoints. Errors name the protocol each end is told it speaks.

Needs msgpack and websockets (the ``openpi`` or ``vlaeval`` extra); ``import rlmesh`` imports
neither.

Example (what both servers make of an observation, and of the model's output):
    >>> import numpy as np
    >>> from rlmesh.remote.websocket.inputs import ObservationInputs
    >>> from rlmesh.remote.websocket.server import one_row
    >>> lane = ObservationInputs(None).lane({"state": np.ones(3), "prompt": "go"})
    >>> lane["state"].shape, lane["prompt"], one_row(lane["state"] * 2, "a")["actions"]
    ((1, 3), ['go'], array([2., 2., 2.]))
"""
