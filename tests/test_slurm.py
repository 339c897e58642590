"""``--executor slurm``: a grid as Slurm jobs on a real Slurm (controller and node on loopback),
one job cancelled mid-grid, resumed by rerunning the command, equals the local serial grid bit for
bit.

Needs Slurm's daemons and munge (Debian: ``apt-get install slurm-wlm munge``); CI installs them
and sets ``FEDWEAR_REQUIRE_SLURM=1``, so that there the test fails, not skips, without them.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import needs_extra
from tests.test_cluster import CONFIG, assert_equals_local_grid, free_port, local_grid

pytestmark = pytest.mark.extra("cluster")
needs_extra("cluster")
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel")
SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
missing = [d for d in DAEMONS if shutil.which(d, path=SBIN) is None]
if missing and os.environ.get("FEDWEAR_REQUIRE_SLURM") != "1":
    pytest.skip(f"no Slurm here ({', '.join(missing)}): apt-get install slurm-wlm munge", allow_module_level=True)


def slurm_conf(root: Path, user: str) -> str:
    """One controller and one 2-CPU node, both this machine on loopback; no accounting."""
    return f"""ClusterName=fedwear-test
SlurmctldHost=localhost
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch):
    """munged, slurmctld and slurmd in a temp dir (short: it holds munge's socket); stopped at the end."""
    assert not missing, f"Slurm is required here (FEDWEAR_REQUIRE_SLURM=1) but {', '.join(missing)} is missing"
    root = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, getpass.getuser()))
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": SBIN}
    quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}  # they log to files
    which = {d: shutil.which(d, path=SBIN) for d in DAEMONS}
    daemons = [subprocess.Popen([which["munged"], "-F", "--force", f"--socket={root}/munge.socket",
                                 f"--key-file={key}", f"--pid-file={root}/munged.pid",
                                 f"--log-file={root}/munged.log", f"--seed-file={root}/munge.seed"], **quiet)]
    try:
        deadline = time.time() + 30
        while not (root / "munge.socket").exists() and time.time() < deadline:
            time.sleep(0.1)
        daemons.append(subprocess.Popen([which["slurmctld"], "-D", "-i", "-f", str(conf)], **quiet))
        daemons.append(subprocess.Popen([which["slurmd"], "-D", "-N", "localhost", "-f", str(conf)], **quiet))
        deadline = time.time() + 60
        while time.time() < deadline:
            state = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True, env=env)
            if state.stdout.strip() == "idle":
                break
            time.sleep(0.5)
        else:
            logs = "".join((root / f).read_text()[-2000:] for f in ("slurmctld.log", "slurmd.log")
                           if (root / f).exists())
            pytest.fail(f"the loopback Slurm never became idle:\n{logs}")
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        yield env
    finally:
        for proc in reversed(daemons):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_a_grid_as_slurm_jobs_resumes_a_cancelled_job_and_equals_the_local_grid(slurm, tmp_path: Path) -> None:
    grid = local_grid(tmp_path, {**CONFIG, "rounds": 60})
    out = tmp_path / "slurm"
    on_slurm = [*grid, "--out", str(out), "--executor", "slurm", "--slurm", "partition=test"]
    proc = subprocess.Popen(on_slurm, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=slurm)
    deadline, victim = time.time() + 300, None
    while time.time() < deadline and victim is None:  # a run past its first checkpoints
        for run in out.glob("*-s*"):
            rounds = run / "rounds.csv"
            if rounds.is_file() and len(rounds.read_text().splitlines()) > 4 and not (run / "summary.json").exists():
                victim = run
                break
        time.sleep(0.1)
    assert victim is not None, "no run got under way"
    jobs = subprocess.run(["squeue", "--noheader", "--format=%i %j"], capture_output=True, text=True, env=slurm)
    job = next(line.split()[0] for line in jobs.stdout.splitlines() if line.split()[1] == f"fedwear-{victim.name}")
    holder = (victim / ".fedwear-lock").read_text()  # "fedwear (pid N on host ...)"
    os.kill(int(holder.split("pid ")[1].split()[0]), signal.SIGKILL)  # lost as in a kill for memory
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 2, stderr
    assert f"{victim}: its Slurm job {job} ended without a result" in stderr
    assert "rerun the same command to resume it" in stderr and "Traceback" not in stderr
    again = subprocess.run(on_slurm, capture_output=True, text=True, env=slurm, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "[4/4 done, 0 running, 0 queued]" in again.stderr
    assert "resume after round" in (victim / "run.log").read_text()
    assert_equals_local_grid(out, tmp_path)
