"""Settings: an empty variable (as Compose passes one it was not given) means unset, in both planes."""

from __future__ import annotations

from orchestrator.config import DEFAULT_SKILLS_ROOT, Settings
from worker.config import (
    CubeCodeExecutorConfig,
    CubeWorkspaceConfig,
    PlaneSettings,
    WorkerSettings,
)


def test_an_empty_variable_means_the_setting_is_not_configured(monkeypatch):
    for name in ("SKILLRUN_WORK_ROOT", "SKILLRUN_REDIS_URL", "SKILLRUN_ENVS_DIR", "SKILLS_ROOT", "OPENAI_API_KEY",
                 "OPENAI_BASE_URL", "E2B_API_KEY", "E2B_API_URL", "CUBE_ROOT"):
        monkeypatch.setenv(name, "")
    worker = WorkerSettings()
    assert worker.work_root is None and worker.redis_url is None and worker.envs_dir is None
    orchestrator = Settings()
    assert orchestrator.skills_root == DEFAULT_SKILLS_ROOT
    assert orchestrator.openai_api_key is None and orchestrator.openai_base_url is None
    cube = CubeCodeExecutorConfig()
    assert cube.api_key is None and cube.api_url is None
    assert CubeWorkspaceConfig().root == CubeWorkspaceConfig.model_fields["root"].default


def test_a_set_variable_is_still_read(monkeypatch, tmp_path):
    monkeypatch.setenv("SKILLRUN_WORK_ROOT", str(tmp_path))
    monkeypatch.setenv("SKILLS_ROOT", str(tmp_path / "skills"))
    assert WorkerSettings().work_root == tmp_path
    assert Settings().skills_root == str(tmp_path / "skills")


def test_a_setting_both_planes_read_is_declared_once():
    """What the control plane's and the worker's settings share comes from ``PlaneSettings``, declared there alone."""
    from_both = set(Settings.model_fields) & set(WorkerSettings.model_fields)
    assert from_both == set(PlaneSettings.model_fields)
    for plane in (Settings, WorkerSettings):
        redeclared = from_both & set(vars(plane).get("__annotations__", {}))
        assert redeclared == set(), f"{plane.__name__} declares again: {redeclared}"
