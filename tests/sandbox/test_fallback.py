"""The fallback where PID and mount namespaces are unavailable: it still holds."""

from __future__ import annotations

import os

import pytest

from rstar2.sandbox import IsolationConfig, Limits, LocalPool

from ..conftest import sandbox_processes, wait_no_sandbox_processes_except


@pytest.mark.parametrize("filesystem", [False, True], ids=["no-mount-ns", "mount-ns"])
async def test_fallback_without_pid_namespaces_still_cleans_up(filesystem):
    """Where PID namespaces (and maybe mount namespaces) are unavailable: a cgroup sweep after each
    call, and a temp dir per call without a private /tmp. (With only the mount namespace, the sweep
    once failed every call: the worker's private mounts hid the cgroup file it opened by path.)"""
    iso = IsolationConfig(pid=False, filesystem=filesystem)
    async with LocalPool(workers=1, limits=Limits(timeout_s=5), isolation=iso) as pool:
        layers = {layer["name"]: layer["active"] for layer in pool.layers}
        assert layers["pid"] is False
        r = await pool.run("import os\nopen('f.txt', 'w').write('x')\nprint(os.getcwd())")
        assert r.status == "ok", r
        if not layers["fs"]:
            assert "rstar2-call-" in r.stdout
            assert not os.path.exists(r.stdout.strip())  # the call's directory is removed afterwards
        before = set(sandbox_processes())
        code = (
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        time.sleep(300)\n    os._exit(0)\ntime.sleep(0.2)"
        )
        assert (await pool.run(code)).status == "ok"
        if layers.get("cgroup"):
            assert wait_no_sandbox_processes_except(before) == []
        assert (await pool.run("6 * 7")).value == "42"
