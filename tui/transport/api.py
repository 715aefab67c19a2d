"""AgentApi: one typed method per agent op, the only way code above the transport
talks to the agent.

Each method builds its op's arguments and parses its result with the types of
`tui.protocol.ops` (pure), whose reply types name their op (`Chunk.op`); the one
thing a subclass supplies is the wire,
`call_with_progress(op, on_event, **args) -> result dict`. `AgentClient` is the real
one; a test's fault-injecting or replaying client subclasses this too and sees every
request as (op, args), exactly as the agent would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tui.protocol import KillProgress, Snapshot, b64encode, parse_message
from tui.protocol.ops import (
    Chunk,
    Compiled,
    DiskUsage,
    FileContent,
    FileWritten,
    KillReport,
    LaunchReply,
    LaunchRequest,
    ModuleLocation,
    Outcome,
    PatchApplied,
    PatchFile,
    PruneReport,
    RunList,
    Subscribed,
)

ProgressCallback = Callable[[KillProgress], object]


class AgentApi:
    """The agent's ops as methods (docs/architecture.md, "Agent protocol").

    Each raises `AgentRequestError` when the agent refuses, a `TransportError`
    (`LinkLost`) when the link drops first, and `ProtocolError` (a ValueError) when
    the result lacks what its reply type needs."""

    async def call_with_progress(
        self, op: str, on_event: ProgressCallback | None, **args: Any
    ) -> dict[str, Any]:
        """The wire: send `op` with `args`, calling `on_event` for each kill_progress
        tagged with the request's id; the agent's result object."""
        raise NotImplementedError

    async def request(self, op: str, **args: Any) -> dict[str, Any]:
        """The wire, without progress events."""
        return await self.call_with_progress(op, None, **args)

    # -- the host and its snapshots ------------------------------------------------

    async def configure(self, interval: float, match: str | None = None,
                        runs_dir: str | None = None) -> None:
        """Snapshots every `interval` s from now on (the first at once); `match` adopts
        processes as external runs; `runs_dir` (None: the agent's default) holds runs."""
        await self.request("configure", interval=interval, match=match, runs_dir=runs_dir)

    async def snapshot(self) -> Snapshot:
        """One snapshot now, as the periodic ones come."""
        result = await self.request("snapshot")
        msg = parse_message({**result, "type": "snapshot"})
        assert isinstance(msg, Snapshot)
        return msg

    # -- logs and files ------------------------------------------------------------

    async def subscribe(self, sub: str, path: str, offset: int = 0,
                        inode: int | None = None) -> Subscribed:
        """Follow `path` from `offset` (negative: that many bytes before the end) as
        `log` events named `sub`; with `inode`, a different file there is a rotation."""
        return Subscribed.parse(
            await self.request(Subscribed.op, sub=sub, path=path, offset=offset, inode=inode))

    async def unsubscribe(self, sub: str) -> None:
        await self.request("unsubscribe", sub=sub)

    async def follow_job(self, run_id: str | None, how: str = "srun") -> None:
        """Follow a running Slurm run to its node (`how`: srun | ssh): the snapshots then
        carry that node's GPUs and the job's processes; `run_id` None stops."""
        await self.request("follow_job", run_id=run_id, how=how)

    async def read_range(self, path: str, offset: int, length: int) -> Chunk:
        """Up to `length` bytes of `path` from `offset` (the agent caps a read at 4 MiB)."""
        return Chunk.parse(
            await self.request(Chunk.op, path=path, offset=offset, length=length))

    async def file_read(self, path: str) -> FileContent:
        return FileContent.parse(await self.request(FileContent.op, path=path))

    async def file_write(self, path: str, data: bytes, expect_sha256: str | None = None,
                         backup: str | None = None) -> FileWritten:
        """Write `path` atomically, only if its sha256 is still `expect_sha256` (when given)."""
        return FileWritten.parse(await self.request(
            FileWritten.op, path=path, b64=b64encode(data), expect_sha256=expect_sha256,
            backup=backup))

    async def patch_apply(self, files: Sequence[PatchFile], target: str) -> PatchApplied:
        """Write every file or none: one transaction on the host (remote/agent/journal.py)."""
        return PatchApplied.parse(await self.request(
            PatchApplied.op, files=[f.args() for f in files], target=target))

    async def resolve_module(self, module: str, python: str | None) -> ModuleLocation:
        return ModuleLocation.parse(
            await self.request(ModuleLocation.op, python=python, module=module))

    async def py_compile(self, source: bytes, filename: str, python: str | None) -> Compiled:
        return Compiled.parse(await self.request(
            Compiled.op, python=python, filename=filename, b64=b64encode(source)))

    async def disk_usage(self, path: str | None = None) -> DiskUsage:
        """The free space where `path` lives (None: the agent's runs dir)."""
        return DiskUsage.parse(await self.request(DiskUsage.op, path=path))

    # -- runs ----------------------------------------------------------------------

    async def runs(self) -> RunList:
        return RunList.parse(await self.request(RunList.op))

    async def launch(self, spec: LaunchRequest, action: str | None = None) -> LaunchReply:
        """Start a run through the host's supervisor shim; with `action`, the agent
        keeps the outcome under that id (`outcomes`)."""
        extra = {"action": action} if action else {}
        return LaunchReply.parse(await self.request(LaunchReply.op, **extra, **spec.args()))

    async def kill(self, run_id: str, graces: Sequence[float], gpu_wait: float,
                   action: str | None = None,
                   on_progress: ProgressCallback | None = None) -> KillReport:
        """SIGINT -> SIGTERM -> SIGKILL (or scancel), then wait for the run's GPU memory."""
        extra = {"action": action} if action else {}
        return KillReport.parse(await self.call_with_progress(
            KillReport.op, on_progress, run_id=run_id, graces=list(graces), gpu_wait=gpu_wait, **extra))

    async def prune(self, older_than: float | None, keep: int | None, dry_run: bool,
                    env: Mapping[str, str] | None = None) -> PruneReport:
        return PruneReport.parse(await self.request(
            PruneReport.op, older_than=older_than, keep=keep, dry_run=dry_run,
            env=None if env is None else dict(env)))

    async def outcomes(self, ids: Sequence[str], runs_dir: str | None = None) -> dict[str, Outcome]:
        """The recorded outcomes of actions by id (an id the host never saw is absent)."""
        return Outcome.parse_all(await self.request("outcomes", ids=list(ids), runs_dir=runs_dir))
