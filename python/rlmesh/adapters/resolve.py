"""Pairing env tags with a role-based model spec: ``resolve`` -> ``Plan``."""

from __future__ import annotations


def resolve(env_tags, observation_space, action_space, model_spec):
    raise NotImplementedError
