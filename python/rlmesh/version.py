"""The installed rlmesh's version: one home, so modules that record it (results headers,
provenance, ``rlmesh --version``) need not import the package's ``__init__``.

Example:
    >>> from rlmesh.version import __version__
    >>> isinstance(__version__, str)
    True
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlmesh")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
