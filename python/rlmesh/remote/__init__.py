"""Envs and models served over gRPC, speaking rlmesh-wire-v1 (edition 2026.06).

- ``codec``: spaces, values and infos as the wire's messages;
- ``wire/``: the protobuf and gRPC modules generated from ``proto/`` by
  ``scripts/generate_wire.py`` (do not edit them).

Needs the ``remote`` extra: ``pip install "rlmesh[remote]"``.
"""
