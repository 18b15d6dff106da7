"""The bubblewrap command line (``rlmesh.sandbox.bwrap``): what the sandbox shares with the
host, and what it does not."""

from __future__ import annotations

from rlmesh.sandbox.bwrap import bwrap_argv


def pairs(argv, flag, arity):
    return [tuple(argv[i + 1 : i + 1 + arity]) for i, each in enumerate(argv) if each == flag]


def test_a_read_only_root_a_private_tmp_and_every_namespace_its_own():
    argv = bwrap_argv(
        read_only=["/opt/venv", "/tmp/run/path"],
        writable=["/tmp/run/sock", "/tmp/run/work"],
        network=False,
        workdir="/tmp/run/work",
        bwrap="bwrap",
    )
    assert pairs(argv, "--ro-bind", 2)[0] == ("/", "/")
    assert ("/tmp",) in pairs(argv, "--tmpfs", 1)
    assert "--unshare-all" in argv and "--share-net" not in argv
    assert "--die-with-parent" in argv
    assert pairs(argv, "--bind", 2) == [("/tmp/run/sock",) * 2, ("/tmp/run/work",) * 2]
    assert ("/opt/venv", "/opt/venv") in pairs(argv, "--ro-bind", 2)
    # Paths under /tmp are bound after the private /tmp is made, or it would hide them.
    assert argv.index("--tmpfs") < argv.index("/tmp/run/path")
    assert pairs(argv, "--chdir", 1) == [("/tmp/run/work",)]


def test_the_hosts_network_only_when_asked():
    shared = bwrap_argv(read_only=(), writable=(), network=True, workdir="/", bwrap="bwrap")
    assert "--share-net" in shared and "--unshare-all" in shared
