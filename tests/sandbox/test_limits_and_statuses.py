"""Every status and every limit, on real isolated workers: each bad snippet ends with the right
status, the pool keeps serving, and nothing the code started is left behind."""

from __future__ import annotations

import os

from rstar2.sandbox import ExecRequest

from ..conftest import wait_no_sandbox_processes

ROOT = os.geteuid() == 0


async def still_serving(pool) -> None:
    r = await pool.run("print(6 * 7)")
    assert r.status == "ok" and r.stdout == "42\n"


async def test_ok_and_notebook_value(pool):
    r = await pool.run("print(1 + 1)")
    assert (r.status, r.stdout, r.value, r.exit_code) == ("ok", "2\n", None, 0)
    r = await pool.run("x = 6\nx * 7")
    assert (r.status, r.stdout, r.value) == ("ok", "", "42")
    r = await pool.run("print('shown')\n123")  # something was printed: no value
    assert r.stdout == "shown\n" and r.value is None
    r = await pool.run("None")
    assert r.value is None


async def test_error_has_type_and_clean_traceback(pool):
    r = await pool.run("def f(n):\n    return 1 / n\n\nf(0)")
    assert r.status == "error" and r.error_type == "ZeroDivisionError" and r.exit_code == 1
    assert 'File "<code>", line 4' in r.stderr and "ZeroDivisionError: division by zero" in r.stderr
    assert (
        "rstar2" not in r.stderr and "interpreter.py" not in r.stderr
    )  # the sandbox's own frames are removed
    r = await pool.run("def broken(:\n  pass")
    assert r.status == "error" and r.error_type == "SyntaxError"


async def test_sys_exit_codes(pool):
    r = await pool.run("import sys; sys.exit(3)")
    assert (r.status, r.exit_code) == ("error", 3)
    r = await pool.run("import sys; print('bye'); sys.exit(0)")
    assert (r.status, r.exit_code, r.stdout) == ("ok", 0, "bye\n")


async def test_stdin_from_input(pool):
    r = await pool.run(ExecRequest("a, b = map(int, input().split())\nprint(a * b)", input="6 7\n"))
    assert r.stdout == "42\n"
    r = await pool.run("input()")
    assert r.status == "error" and r.error_type == "EOFError"


async def test_infinite_loop_times_out(pool):
    r = await pool.run(ExecRequest("while True:\n    pass", timeout_s=1.0))
    assert r.status == "timeout" and "1 s" in r.reason
    await still_serving(pool)


async def test_huge_allocation_is_memory(pool):
    r = await pool.run("a = bytearray(10 * 1024**3)")
    assert r.status == "memory" and r.error_type == "MemoryError"
    r = await pool.run(ExecRequest("import numpy as np\na = np.ones((400, 1024, 1024))", memory_mb=256))
    assert r.status == "memory"
    await still_serving(pool)


async def test_fork_bomb_is_contained(pool):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r = await pool.run(ExecRequest(code, timeout_s=2.0))
    assert r.status in ("timeout", "error", "memory"), (r.status, r.reason)
    assert wait_no_sandbox_processes(timeout=60) == []  # 64 exits can take a while on a slow VM
    await still_serving(pool)


async def test_thread_bomb_is_contained(pool):
    code = (
        "import threading, time\nn = 0\n"
        "try:\n    while True:\n        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n        n += 1\n"
        "except Exception as e:\n    print(type(e).__name__, n)\n"
    )
    r = await pool.run(ExecRequest(code, timeout_s=5.0))
    assert r.status in ("ok", "error", "timeout", "memory") and r.status != "internal"
    if r.status == "ok":
        count = int(r.stdout.split()[1])
        assert count < 1000  # capped by the process/thread limit
    assert wait_no_sandbox_processes() == []
    await still_serving(pool)


async def test_100mb_of_output_is_stopped_and_cut(pool):
    r = await pool.run("import sys\nfor _ in range(1000):\n    sys.stdout.write('x' * 100_000)")
    assert r.status == "output_limit" and r.truncated
    assert len(r.stdout) < 80_000 and "bytes cut]" in r.stdout
    await still_serving(pool)


async def test_long_output_cut_in_the_middle(pool):
    r = await pool.run("print('HEAD' + 'x' * 200_000 + 'TAIL')")
    assert r.status == "ok" and r.truncated
    assert r.stdout.startswith("HEAD") and r.stdout.rstrip().endswith("TAIL") and "bytes cut]" in r.stdout


async def test_binary_and_invalid_utf8_output(pool):
    r = await pool.run(
        "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe \\x00 end')\nsys.stderr.buffer.write(b'\\xc3')"
    )
    assert r.status == "ok"
    assert r.stdout.startswith("ok ") and "\\xff" in r.stdout and r.stdout.endswith("end")
    assert "\\xc3" in r.stderr


async def test_cannot_write_outside_tmp_and_tmp_is_fresh(pool):
    r = await pool.run("open('/etc/owned', 'w').write('x')")
    assert r.status == "error" and r.error_type in ("OSError", "PermissionError")
    r = await pool.run("import os\nopen('note.txt', 'w').write('hi')\nprint(os.getcwd(), os.listdir('.'))")
    assert r.status == "ok" and "note.txt" in r.stdout
    r = await pool.run("import os\nprint(os.listdir('.'))")
    assert r.stdout == "[]\n"  # a fresh working directory per call


async def test_no_network(pool):
    r = await pool.run("import socket\ns = socket.create_connection(('127.0.0.1', 22), timeout=2)")
    assert r.status == "error" and r.error_type in ("OSError", "ConnectionRefusedError", "TimeoutError")
    r = await pool.run("import socket\nsocket.getaddrinfo('example.com', 80)")
    assert r.status == "error"


async def test_cannot_kill_the_parent(pool):
    r = await pool.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    assert r.status in ("ok", "error")
    r = await pool.run(
        "import os, signal\nfor pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    if pid != os.getpid():\n        os.kill(pid, signal.SIGKILL)\nprint('done')"
    )
    assert r.status in ("ok", "error")
    await still_serving(pool)


async def test_setsid_daemon_does_not_survive(pool):
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(300)\n    os._exit(0)\n"
        "time.sleep(0.2)\nprint('parent returns')"
    )
    r = await pool.run(code)
    assert r.status == "ok" and r.stdout == "parent returns\n"
    assert wait_no_sandbox_processes() == []


async def test_environment_has_no_secrets(pool):
    r = await pool.run("import os\nprint(sorted(os.environ))\nprint(os.environ.get('RSTAR2_TEST_SECRET'))")
    assert r.status == "ok" and "RSTAR2_TEST_SECRET" not in r.stdout and "hunter2" not in r.stdout
    r = await pool.run("print(open('/proc/1/environ', 'rb').read())")
    assert "hunter2" not in r.stdout


async def test_segfault_is_an_error_with_its_signal(pool):
    r = await pool.run("import ctypes\nctypes.string_at(0)")
    assert r.status == "error" and r.signal == "SIGSEGV"
    await still_serving(pool)


async def test_seccomp_denies_namespaces_mount_and_ptrace(pool):
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno())\n"
        "print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())\n"
        "print(libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"
    )
    r = await pool.run(code)
    lines = r.stdout.split()
    assert r.status == "ok" and lines[0::2] == ["-1", "-1", "-1"], r.stdout
    assert all(int(e) == 1 for e in lines[1::2])  # EPERM


async def test_many_concurrent_calls_are_all_correct(pool):
    results = await pool.run_many([f"print({i} * {i})" for i in range(300)])
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(300)]


def test_layers_active_here(pool):
    """As root (CI) every layer is on; otherwise the uid and cgroup layers say why they are not."""
    layers = {layer["name"]: layer for layer in pool.layers}
    for name in ("net", "pid", "fs", "seccomp", "rlimits", "env"):
        assert layers[name]["active"], layers[name]
    for name in ("uid", "cgroup"):
        assert layers[name]["active"] is ROOT and layers[name]["detail"], layers[name]
