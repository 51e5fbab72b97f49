"""The "always" approvals file (bastion.config.approved) changed by several processes at once: none is lost."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import tomlkit

from bastion.config.approved import APPROVED_FILE, LOCK_FILE, ApprovedModes

_ADDS = 25
_APPROVER = textwrap.dedent(
    """
    import sys
    from datetime import UTC, datetime
    from pathlib import Path
    from bastion.config.approved import ApprovedModes

    directory, name, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    approved = ApprovedModes(directory)
    sys.stdin.readline()  # every process starts its changes at once
    for n in range(count):
        approved.add(f"{name}:act_{n}", by=name, invocation_id=f"{name}-{n}", at=datetime.now(UTC))
    """
)


def test_approvals_written_by_several_processes_at_once_are_all_kept(tmp_path: Path) -> None:
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _APPROVER, str(tmp_path), name, str(_ADDS)],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("first", "second", "third")
    ]
    try:
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        for process in processes:
            _, stderr = process.communicate(timeout=120)
            assert process.returncode == 0, stderr
    finally:
        for process in processes:
            process.kill()
    written = tomlkit.parse((tmp_path / "policies" / APPROVED_FILE).read_text())["modes"]
    expected = {f"{name}:act_{n}" for name in ("first", "second", "third") for n in range(_ADDS)}
    assert set(written) == expected
    assert set(ApprovedModes(tmp_path).current()) == expected
    assert (tmp_path / "policies" / LOCK_FILE).is_file()  # beside the file, a dot file the loader never reads


def test_a_revocation_reads_the_file_again_and_keeps_what_another_instance_approved_meanwhile(tmp_path: Path) -> None:
    here = ApprovedModes(tmp_path)
    elsewhere = ApprovedModes(tmp_path)
    now = datetime.now(UTC)
    here.add("notes:write_note", by="ana", invocation_id="one", at=now)
    elsewhere.add("notes:delete_note", by="bo", invocation_id="two", at=now)  # `here` has not read it yet
    assert here.revoke("notes:write_note")
    assert set(ApprovedModes(tmp_path).current()) == {"notes:delete_note"}
