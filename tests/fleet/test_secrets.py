"""Files the fleet trusts: the cluster address `fleet up` saved is read back only if this user
wrote it and nobody else can change it (a planted one would send the client, and its Ray token,
elsewhere)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from specserve.fleet.cluster import address_file, connect
from specserve.fleet.secrets import write_private


def test_a_planted_or_loose_address_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    path = address_file()
    write_private(path, "10.9.8.7:6379")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    os.chmod(path, 0o666)  # anyone could have written it
    with pytest.raises(SystemExit, match=r"not trusting fleet address file .*: group or others"):
        connect(None)
    os.chmod(path, 0o600)
    if os.getuid() == 0:  # root can make it someone else's
        os.chown(path, 12345, -1)
        with pytest.raises(SystemExit, match="owned by uid 12345"):
            connect(None)
