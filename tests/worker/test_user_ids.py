"""The host-wide registry of sandbox user ids."""

from __future__ import annotations

import shutil

import pytest

from worker.errors import WorkspaceError
from worker.workspaces.user_ids import UserIdRegistry, host_account_exists


def test_two_owners_never_hold_the_same_id_and_an_owner_keeps_its_own(tmp_path):
    registry = UserIdRegistry(tmp_path / "uids", base=40000, count=3)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    first, second = registry.allocate(a, 0), registry.allocate(b, 0)
    assert first != second
    assert registry.claim(first, a) and not registry.claim(first, b)


def test_an_id_whose_workspace_folder_is_gone_is_handed_out_again(tmp_path):
    registry = UserIdRegistry(tmp_path / "uids", base=40000, count=1)
    work_root = tmp_path / "root"
    (work_root / "ws").mkdir(parents=True)
    uid = registry.allocate(work_root / "ws", 0)
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(WorkspaceError, match="all 1 sandbox user ids are in use"):
        registry.allocate(other, 0)
    shutil.rmtree(work_root)  # the whole work root deleted: nothing released its ids
    assert registry.allocate(other, 0) == uid


def test_a_released_id_is_free_and_release_by_another_owner_does_nothing(tmp_path):
    registry = UserIdRegistry(tmp_path / "uids", base=40000, count=1)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    uid = registry.allocate(a, 0)
    registry.release(uid, b)
    assert not registry.claim(uid, b)
    registry.release(uid, a)
    assert registry.allocate(b, 0) == uid


def test_ids_of_host_users_and_groups_are_never_handed_out(tmp_path):
    registry = UserIdRegistry(tmp_path / "uids", base=0, count=70000)  # 0 is root's
    owner = tmp_path / "ws"
    owner.mkdir()
    assert host_account_exists(0)
    uid = registry.allocate(owner, 0)
    assert uid != 0 and not host_account_exists(uid)
