"""A throwaway one-node Slurm cluster on this machine, to try submit.sh without a real cluster.

    sudo python3 tools/local_slurm.py -- env SHARDS=4 CPUS=1 WAIT=1 deploy/slurm/submit.sh

starts slurmctld and slurmd (Debian's slurm-wlm packages: slurmctld, slurmd, slurm-client) in a
temporary folder, runs the command with SLURM_CONF pointing at them, and stops them again, whatever
happens. It needs root (slurmd starts jobs as their user). The cluster uses auth/none (no munge
daemon) and no cgroups (proctrack/linuxproc, task/none), so it also runs inside a container. The
project's Slurm test uses the same `LocalSlurm`. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODE, PARTITION = "gradernode", "grading"
DAEMONS = ("slurmctld", "slurmd")


class SlurmError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def slurm_conf(folder: Path, cpus: int) -> str:
    host = socket.gethostname().split(".")[0]  # slurmctld only runs where SlurmctldHost names it
    return "\n".join(
        [
            "ClusterName=mhalocal",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "AuthType=auth/none",
            "CredType=cred/none",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={folder / 'state'}",
            f"SlurmdSpoolDir={folder / 'spool'}",
            f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
            f"SlurmdPidFile={folder / 'slurmd.pid'}",
            f"SlurmctldLogFile={folder / 'slurmctld.log'}",
            f"SlurmdLogFile={folder / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "MinJobAge=600",  # finished jobs stay visible to scontrol for 10 minutes
            f"NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


class LocalSlurm:
    """`with LocalSlurm(folder) as env:` a running cluster; `env` points Slurm's commands at it."""

    def __init__(self, folder: Path, cpus: int | None = None, start_seconds: float = 90):
        self.folder, self.cpus, self.start_seconds = Path(folder), cpus or os.cpu_count(), start_seconds
        self.daemons: list[subprocess.Popen] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.folder / "slurm.conf")}

    def __enter__(self) -> dict[str, str]:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self.env

    def __exit__(self, *exc):
        self.stop()

    def log(self, daemon: str) -> str:
        path = self.folder / f"{daemon}.out"
        return path.read_text()[-3000:] if path.exists() else ""

    def start(self):
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        conf = self.folder / "slurm.conf"
        conf.write_text(slurm_conf(self.folder, self.cpus))
        for daemon, extra in zip(DAEMONS, ([], ["-N", NODE])):
            with open(self.folder / f"{daemon}.out", "w") as log:
                self.daemons.append(
                    subprocess.Popen(
                        [daemon, "-D", "-f", str(conf), *extra],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=self.env,
                        start_new_session=True,
                    )
                )
        deadline, state = time.monotonic() + self.start_seconds, ""
        while time.monotonic() < deadline:
            for daemon in self.daemons:
                if daemon.poll() is not None:
                    raise SlurmError(
                        f"{daemon.args[0]} exited with status {daemon.returncode}:\n" + self.log(daemon.args[0])
                    )
            state = subprocess.run(
                ["sinfo", "--noheader", "--format=%t"], capture_output=True, text=True, env=self.env, timeout=30
            ).stdout.strip()
            if state == "idle":
                return
            time.sleep(1)
        raise SlurmError(f"the node never became idle (last state {state!r}):\n{self.log('slurmd')}")

    def stop(self):
        """Cancel what is left of the jobs, then stop the daemons (SIGTERM, then SIGKILL after 30 s)."""
        if any(daemon.poll() is None for daemon in self.daemons):
            subprocess.run(
                ["scancel", "--full", f"--partition={PARTITION}"], env=self.env, capture_output=True, timeout=30
            )
        for daemon in reversed(self.daemons):
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
        for daemon in reversed(self.daemons):
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
        self.daemons.clear()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpus", type=int, default=None, help="CPUs the node offers (default: this machine's)")
    parser.add_argument("command", nargs="+", help="the command to run against the cluster (after --)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("slurmd must run as root to start jobs: run this as root")
    with tempfile.TemporaryDirectory(prefix="mha-slurm-") as folder, LocalSlurm(Path(folder), args.cpus) as env:
        return subprocess.run(args.command, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
